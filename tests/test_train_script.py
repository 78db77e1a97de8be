"""scripts/train.py and scripts/gpu_check.py run end to end on CPU (small sizes; no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from kline_store.store import create_store

    rng = np.random.default_rng(3)
    n_sym, n_dates = 4, 160
    close = 20 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_dates)), axis=1))
    panel = np.stack([close, close * 1.01, close * 0.99, close, rng.lognormal(10, 1, close.shape)],
                     axis=2).astype(np.float32)
    dates = np.arange(np.datetime64("2019-01-01"), np.datetime64("2019-01-01") + n_dates)
    path = tmp_path_factory.mktemp("train") / "st"
    create_store(path, panel, [f"S{i}" for i in range(n_sym)], dates, ["open", "high", "low", "close", "volume"])
    return path


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_train_prints_loss_and_meter(store, model):
    r = run("train.py", str(store), "--steps", "12", "--log-every", "5", "--batch-size", "32", "--window", "16",
            "--model", model, "--json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split()[1] for ln in steps] == ["5", "10", "12"]
    assert all("loss" in ln and "data-wait" in ln and "samples/s" in ln for ln in steps)
    summary = json.loads(lines[-1])
    assert summary["steps"] == 12 and summary["device"] == "cpu" and np.isfinite(summary["final_loss"])
    assert 0 <= summary["data_wait_pct"] <= 100 and summary["samples"] > 0


def test_train_rejects_missing_cuda():
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("train_script", ROOT / "scripts" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.pick_device("cpu").type == "cpu"
    assert mod.pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="CUDA is not available"):
            mod.pick_device("cuda")


def test_gpu_check_runs_on_cpu_and_skips_cuda_parts():
    r = run("gpu_check.py", "--gb", "0.002", "--dates", "300", "--window", "16", "--batch-size", "64",
            "--steps", "4", "--seconds", "0.3", "--json")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    import torch

    if not torch.cuda.is_available():
        assert "SKIP h2d_pinned_vs_pageable: needs CUDA" in out and "SKIP device_copy: needs CUDA" in out
    results = json.loads(out.strip().splitlines()[-1])
    assert results["memcpy_gbps"] > 0
    assert "train_memmap" in results and "gather_memmap_gbps" in results
