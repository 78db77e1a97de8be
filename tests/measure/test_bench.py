"""Benchmark plumbing on small stores: every row runs, ratios are consistent, a store smaller than 4 x L3 is
replaced by a synthetic one (no timing asserts)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import run_cli
from kline_store.measure import bench as bn
from kline_store.measure import classic as cl
from kline_store.measure import synthetic
from kline_store.errors import InputError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return synthetic.make_store(tmp_path_factory.mktemp("bench") / "st", 12, 300)


def test_classic_datasets_return_the_windows(store):
    from kline_store import open_store

    with open_store(store) as st:
        sym, end = np.array([0, 3, 11]), np.array([40, 299, 17])
        lay = cl.WindowFile(st.data_file, st.n_symbols, st.date_capacity, st.n_fields, [0, 1, 3], 8, sym, end)
        want = [torch.from_numpy(np.ascontiguousarray(st.panel[s, e - 7: e + 1][:, [0, 1, 3]]))
                for s, e in zip(sym, end)]
    for i in range(3):
        torch.testing.assert_close(cl.MemmapDataset(lay)[i], want[i], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(cl.PreadDataset(lay)[i], want[i], rtol=0, atol=0, equal_nan=True)
    batch = next(cl.memmap_prefetch(lay, 2, seed=0))
    assert batch.shape == (2, 8, 3)


def test_bench_runs_every_row(store, tmp_path):
    seen = []
    res = bn.bench(store, window=16, batch_size=32, samples=3000, classic_samples=200, rounds=1,
                   min_cache_multiple=0, progress=seen.append)
    names = [r.name for r in res.rows]
    rates = [v for v in bn.VARIANTS if v != "memory"]   # the memory row is printed under the table
    assert names == [*rates, "memcpy"]
    assert [r.name for r in seen] == [v for v in rates if not (v.startswith("qlib") and not cl.qlib_available())]
    mem = res.settings["memory"]
    assert mem["windows"] == res.settings["windows_in_store"] and mem["allowance"] > 0
    assert "against an allowance of" in bn.format_table(res)
    ceiling = res.row("ceiling")
    assert ceiling.of_ceiling == pytest.approx(1.0) and ceiling.note   # names the method that won
    for r in res.rows:
        if r.skipped:
            assert r.name.startswith("qlib") and "pyqlib" in r.note
            continue
        assert r.samples_per_s > 0 and r.spread[0] <= r.samples_per_s == r.spread[1]
        assert r.of_ceiling > 0
        assert r.seconds_per_target == pytest.approx(3000 / r.samples_per_s)
    best = max(res.row(c).samples_per_s for c in bn.CLASSIC)
    assert res.row("kline_store").x_best_classic == pytest.approx(res.row("kline_store").samples_per_s / best)
    assert "us per call" in res.row("getitem").note
    s = res.settings
    assert s["synthetic"] is False and s["fields"] == list(synthetic.FIELDS) and s["l3_bytes"] > 0
    text = bn.format_table(res)
    assert "of ceiling" in text and "x L3" in text and "kline_store" in text
    json.dumps(res.as_dict())
    pytest.importorskip("matplotlib")
    out = bn.plot(res, tmp_path / "b.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_small_store_is_replaced_by_a_synthetic_one(store, monkeypatch, tmp_path):
    monkeypatch.setattr(synthetic, "l3_bytes", lambda: 1 << 20)     # a 1 MiB cache: the store must be >= 4 MiB
    notes = []
    res = bn.bench(store, window=8, batch_size=16, samples=500, rounds=1, variants=["ceiling", "kline_store"],
                   scratch=tmp_path, say=notes.append)
    s = res.settings
    assert s["synthetic"] and s["store_bytes"] >= 4 << 20 and s["user_store_bytes"] < 4 << 20
    assert notes and "synthetic store" in notes[0]
    assert list(tmp_path.iterdir()) == []                            # removed afterwards
    assert "synthetic store" in bn.format_table(res)


def test_bench_rejects_bad_arguments(store):
    with pytest.raises(InputError, match="unknown variant"):
        bn.bench(store, variants=["nope"])
    with pytest.raises(InputError):
        bn.bench(store, batch_size=0)
    with pytest.raises(InputError, match="unknown field"):
        bn.bench(store, fields=["close", "bogus"], variants=["kline_store"], min_cache_multiple=0)


def test_synthetic_sizes():
    assert synthetic.l3_bytes() > 0
    n_sym, n_dates, n_fields = synthetic.shape_for(100 << 20, 2500)
    assert n_sym * n_dates * n_fields * 4 >= 100 << 20 and n_fields == 6


def test_cli_bench_json_and_plot(store, tmp_path, monkeypatch):
    png = tmp_path / "bench.png"
    r = run_cli("bench", str(store), "--min-cache-multiple", "0", "--window", "8", "--batch-size", "16", "--samples", "2000",
                "--classic-samples", "64", "--rounds", "1", "--only", "classic_dl0", "--only", "kline_store",
                "--json", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [row["name"] for row in data["rows"]] == ["classic_dl0", "kline_store", "memcpy"]
    assert png.exists() and "Warning" not in r.stderr
    r = run_cli("bench", str(store), "--only", "bogus")
    assert r.returncode == 1 and r.stderr.startswith("kline-store: error:") and "unknown variant" in r.stderr
