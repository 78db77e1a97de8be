"""The features block budget follows the memory this process may take, its cgroup's limit included, with a one-line
refusal below the minimum; block_symbols is checked before anything is written or garbage-collected (issue 26
parts 5 and 6)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kline_store import append, compute_features, ingest, memory, update_features
from kline_store.errors import InputError
from kline_store.features import compute
from kline_store.features.plan import make_plan
from kline_store.memory import Available
from test_update_source import EXPRS, folder, frames

ROOT = Path(__file__).resolve().parents[2]


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.name != ".lock":
            h.update(str(p.relative_to(path)).encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture()
def computed(tmp_path) -> tuple[Path, Path]:
    base = tmp_path / "base"
    ingest([folder(tmp_path / "in", frames(1, 80), 0, 60)], base)
    compute_features(base, tmp_path / "feats", sets=[], exprs=EXPRS)
    return base, tmp_path / "feats"


@pytest.mark.parametrize("bad", [-3, 0, 1.5, "x", True, float("nan")])
def test_block_symbols_is_refused_before_anything_is_written(computed, tmp_path, bad):
    base, feats = computed
    with pytest.raises(InputError, match=r"block_symbols=.*positive whole number") as got:
        compute_features(base, tmp_path / "new", sets=[], exprs=EXPRS, block_symbols=bad)
    assert "\n" not in str(got.value) and not (tmp_path / "new").exists()
    append(base, [folder(tmp_path / "more", frames(1, 80), 60)])
    before = tree_hash(feats)
    with pytest.raises(InputError, match="block_symbols="):
        update_features(feats, block_symbols=bad)
    with pytest.raises(InputError, match="block_symbols="):
        compute_features(base, feats, sets=[], exprs=EXPRS, block_symbols=bad, replace=True)
    assert tree_hash(feats) == before                           # the good store kept, nothing collected
    assert update_features(feats, block_symbols=np.int64(2)).mode == "tail"


def test_the_budget_is_a_share_of_the_available_memory():
    assert compute.block_budget(Available(100 << 30, "MemAvailable")) == compute.BLOCK_BYTES
    assert compute.block_budget(Available(300 << 20, "cgroup")) == int((300 << 20) * compute.BUDGET_SHARE)
    plan = make_plan([], EXPRS, None)
    assert compute.block_rows(2000, plan, budget=64 << 20) == (64 << 20) // compute.symbol_bytes(2000, plan)
    with pytest.raises(InputError, match="a block of one symbol .* needs .* what fits"):
        compute.block_rows(2000, plan, budget=compute.MIN_BLOCK_BYTES - 1)


def test_too_little_memory_is_one_line_and_nothing_written(computed, tmp_path, monkeypatch):
    base, feats = computed
    monkeypatch.setattr(compute, "available",
                        lambda: Available(20 << 20, "cgroup memory.limit_in_bytes 640 MiB"))
    with pytest.raises(InputError, match="20 MiB available .cgroup memory.limit_in_bytes 640 MiB") as got:
        compute_features(base, tmp_path / "new", sets=[], exprs=EXPRS)
    assert "\n" not in str(got.value) and not (tmp_path / "new").exists()
    append(base, [folder(tmp_path / "more", frames(1, 80), 60)])
    before = tree_hash(feats)
    with pytest.raises(InputError, match="needs"):
        update_features(feats)
    assert tree_hash(feats) == before


CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from kline_store import memory
    memory.join_cgroup(Path(sys.argv[1]))        # before the imports: the whole command is charged, as under a
    import kline_store as ks                      # container's limit
    from kline_store.features import compute
    rep = ks.compute_features(sys.argv[2], sys.argv[3], sets=["alpha158"])
    print(json.dumps({"budget": compute.block_budget(), "available": str(memory.available()), "mode": rep.mode}))
""")


def test_features_under_a_640_mib_cgroup_sizes_its_blocks_from_the_limit(tmp_path):
    from kline_store.store import create_store
    cg = memory.make_cgroup(640 << 20, f"kline-test-features-{os.getpid()}")
    if cg is None:
        pytest.skip("no writable memory cgroup (needs root and cgroup v1 memory or v2 with the memory controller)")
    try:
        rng = np.random.default_rng(0)
        close = 20 * np.exp(np.cumsum(rng.normal(0, 0.02, (24, 900)), 1))
        panel = np.stack([close, close * 1.01, close * 0.99, close, rng.random(close.shape) * 1e6], 2)
        days = np.busday_offset("2015-01-02", np.arange(900), roll="forward")
        create_store(tmp_path / "bars", panel.astype(np.float32), [f"S{i}" for i in range(24)], days,
                     ["open", "high", "low", "close", "volume"])
        done = subprocess.run([sys.executable, "-c", CHILD, str(cg[0]), str(tmp_path / "bars"), str(tmp_path / "f")],
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
    finally:
        memory.remove_cgroup(cg[0])
    assert done.returncode == 0, f"rc={done.returncode} (-9: killed by the OOM killer) {done.stderr[-2000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "cgroup" in out["available"] and out["budget"] < 320 << 20 and out["mode"] == "full"

