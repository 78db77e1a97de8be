"""Benchmark plumbing on a tiny store: every variant runs and the table is consistent (no timing asserts)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kline_store import bench as bn
from kline_store.errors import InputError

from conftest import run_cli


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from kline_store.store import create_store

    rng = np.random.default_rng(0)
    n_sym, n_dates = 5, 200
    fields = ["open", "high", "low", "close", "volume", "amount", "adj_factor"]
    panel = rng.uniform(1, 2, (n_sym, n_dates, len(fields))).astype(np.float32)
    panel[0, :40] = np.nan  # listed later: its first windows are not samples
    dates = np.arange(np.datetime64("2021-01-01"), np.datetime64("2021-01-01") + n_dates)
    path = tmp_path_factory.mktemp("bench") / "st"
    create_store(path, panel, [f"S{i}" for i in range(n_sym)], dates, fields)
    return path


def test_windows_cover_listed_spans_only():
    sym, end = bn._windows(np.array([0, 5, -1]), np.array([9, 9, -1]), 4)
    assert sym.tolist() == [0] * 7 + [1] * 2 and end.tolist() == [3, 4, 5, 6, 7, 8, 9, 8, 9]
    with pytest.raises(InputError):
        bn._windows(np.array([0]), np.array([2]), 4)


def test_classic_datasets_return_the_same_window(store):
    import torch

    from kline_store import open_store

    with open_store(store) as st:
        sym, end = bn._windows(st.first_bar, st.last_bar, 8)
        rows = __import__("os").path.getsize(st.data_file) // (st.row_stride * 4)
        lay = bn._Layout(st.data_file, rows, st.date_capacity, st.n_fields, [0, 1, 3], 8, sym, end)
        i = 17
        want = torch.from_numpy(np.ascontiguousarray(st.panel[sym[i], end[i] - 7 : end[i] + 1][:, [0, 1, 3]]))
    assert torch.equal(bn.MemmapDataset(lay)[i], want)
    assert torch.equal(bn.PreadDataset(lay)[i], want)
    batch = next(bn._memmap_prefetch(lay, 4, seed=0))
    assert batch.shape == (4, 8, 3)


def test_bench_runs_every_variant(store, tmp_path):
    seen = []
    res = bn.bench(store, window=16, batch_size=32, samples=4000, classic_samples=256, config=None,
                   progress=seen.append)
    names = [r.name for r in res.rows]
    assert names == [*bn.VARIANTS, "memcpy"] and [r.name for r in seen] == list(bn.VARIANTS)
    for r in res.rows[:-1]:
        assert r.samples_per_s > 0 and r.samples_measured >= (4000 if r.name == "kline_store" else 256)
        assert r.extrapolated == (r.name != "kline_store")
        assert r.bytes_per_s == pytest.approx(r.samples_per_s * 16 * 6 * 4)
        assert r.memcpy_fraction == pytest.approx(r.bytes_per_s / res.memcpy_bytes_per_s)
        assert r.seconds_per_target == pytest.approx(4000 / r.samples_per_s)
    best = max(r.samples_per_s for r in res.rows if r.name in bn.CLASSIC)
    assert max(r.ratio_to_best_classic for r in res.rows if r.name in bn.CLASSIC) == pytest.approx(1.0)
    assert res.row("kline_store").ratio_to_best_classic == pytest.approx(res.row("kline_store").samples_per_s / best)
    assert res.row("memcpy").memcpy_fraction == pytest.approx(1.0)
    assert res.settings["fields"] == ["open", "high", "low", "close", "volume", "amount"]
    text = bn.format_table(res)
    assert "extrapolated to 4,000" in text and "kline_store" in text and "s/4k" in text
    json.dumps(res.as_dict())
    pytest.importorskip("matplotlib")
    out = bn.plot(res, tmp_path / "b.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_bad_arguments(store):
    with pytest.raises(InputError, match="unknown variant"):
        bn.bench(store, variants=["nope"])
    with pytest.raises(InputError):
        bn.bench(store, batch_size=0)
    with pytest.raises(InputError, match="no field"):
        bn.bench(store, fields=["close", "bogus"], variants=["memmap_dl0"])


def test_cli_bench_json_and_plot(store, tmp_path):
    png = tmp_path / "bench.png"
    r = run_cli("bench", str(store), "--window", "8", "--batch-size", "16", "--samples", "2000",
                "--classic-samples", "64", "--only", "memmap_dl0", "--only", "kline_store", "--json",
                "--plot", str(png))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [row["name"] for row in data["rows"]] == ["memmap_dl0", "kline_store", "memcpy"]
    assert png.exists()
    r = run_cli("bench", str(store), "--window", "8", "--samples", "500", "--classic-samples", "32",
                "--only", "memmap_dl0")
    assert r.returncode == 0 and "memcpy" in r.stdout and "extrapolated" in r.stdout
    r = run_cli("bench", str(store), "--only", "bogus")
    assert r.returncode == 1 and r.stderr.startswith("kline-store: error:") and "unknown variant" in r.stderr
