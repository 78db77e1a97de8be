"""samples/blocks.py and the block order through KlineDataset and its loader: the same samples as the full index
and the uniform order, one-line refusals instead of the OOM killer, and a store under a cgroup memory limit.
Cross-sections' block order: test_day_blocks.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import kline_store as ks
from kline_store.errors import InputError
from kline_store import memory
from kline_store.feed import block_feed
from kline_store.measure.synthetic import make_store
from kline_store.samples import blocks
from kline_store.samples import count_cache
from conftest import resumed

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KLINE_STORE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("blk") / "s", 40, 6000, seed=3)   # 2 segments a row, gaps


def keys(batches):
    return torch.cat([b["symbol"] * 100_000 + b["t"] for b in batches]).numpy()


@pytest.mark.parametrize("opts", [dict(window=16), dict(window=8, horizon=3, missing="ffill", max_missing=2),
                                  dict(window=32, start="2010-06-01", end="2019-01-01", label="log_return")])
def test_block_index_has_the_full_index_positions(store, opts):
    full = ks.KlineDataset(store, index="full", **opts)
    blk = ks.KlineDataset(store, index="blocks", **opts)
    assert not blk.keeps_full_index and full.keeps_full_index
    assert len(full) == len(blk)
    idx = np.arange(len(full))
    assert np.array_equal(blk._index()[idx], full.valid_index())
    assert blk.day_span() == full.day_span()
    pick = np.random.default_rng(0).integers(0, len(full), 500)
    a, b = full.gather_batch(pick), blk.gather_batch(pick)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert blk._index().nbytes < full.valid_index().nbytes / 50   # O(segments), not O(windows)


def test_segment_counts_are_counted_once_per_store_version_and_spec(store, monkeypatch):
    a = ks.KlineDataset(store, window=16, index="blocks")
    assert len(list(count_cache.cache_dir().glob("*.npz"))) == 1

    def no_count(*args, **kw):
        raise AssertionError("counted again")

    monkeypatch.setattr(blocks.BlockIndex, "build", no_count)
    b = ks.KlineDataset(store, window=16, index="blocks")          # loaded: another rank, a restart
    assert np.array_equal(a._index().counts, b._index().counts)
    assert np.array_equal(a.gather_batch([0, 5, 99])["t"], b.gather_batch([0, 5, 99])["t"])
    with pytest.raises(AssertionError, match="counted again"):
        ks.KlineDataset(store, window=17, index="blocks")           # another spec: counted


def test_block_order_delivers_the_uniform_multiset(store):
    full = ks.KlineDataset(store, window=16, index="full")
    blk = ks.KlineDataset(store, window=16, index="blocks")
    uni = keys(full.loader(batch_size=100, order="uniform"))
    by_blocks = keys(blk.loader(batch_size=100, order="blocks", pool_blocks=8))
    assert len(uni) == len(by_blocks) == len(full)
    assert np.array_equal(np.sort(uni), np.sort(by_blocks))
    # the same order whichever index the dataset keeps, threads or none
    same = keys(full.loader(batch_size=100, order="blocks", pool_blocks=8, num_workers=0))
    assert np.array_equal(same, by_blocks)


def test_block_order_with_worker_processes_and_ranks(store):
    blk = ks.KlineDataset(store, window=16, index="blocks")
    ref = keys(blk.loader(batch_size=64, order="blocks", pool_blocks=8, num_workers=0))
    procs = blk.loader(batch_size=64, order="blocks", pool_blocks=8, backend="processes", num_workers=2)
    try:
        assert np.array_equal(keys(procs), ref)
    finally:
        procs.close()
    parts = [keys(blk.loader(batch_size=64, order="blocks", pool_blocks=8, rank=r, world_size=3, tail="drop"))
             for r in range(3)]
    assert len({len(p) for p in parts}) == 1
    allk = np.concatenate(parts)
    assert len(np.unique(allk)) == len(allk) == len(blk) // 3 * 3


def test_resume_mid_epoch(store):
    ds = ks.KlineDataset(store, window=16, index="blocks")
    whole, first, again = resumed(lambda: ds.loader(batch_size=50, order="blocks", pool_blocks=8, seed=4), 37)
    assert np.array_equal(np.concatenate([keys(first), keys(again)]), keys(whole))


def test_auto_picks_uniform_when_it_fits_and_blocks_when_not(store, monkeypatch):
    ds = ks.KlineDataset(store, window=16)
    assert ds.keeps_full_index and ds.loader(batch_size=64).order == "uniform"
    small = memory.Available(ds.read_bytes(), "cgroup memory.max (test)")
    monkeypatch.setattr(block_feed, "available", lambda: small)
    ld = ds.loader(batch_size=64, pool_blocks=4)
    assert ld.order == "blocks" and ld.placement == "memmap"


def test_refusals_are_one_line(store, monkeypatch):
    tiny = memory.Available(1 << 20, "cgroup memory.max 1 MiB")
    monkeypatch.setattr(blocks, "available", lambda: tiny)
    with pytest.raises(InputError) as e:
        ks.KlineDataset(store, window=16, index="full")
    msg = str(e.value)
    assert "\n" not in msg and "needs" in msg and "1 MiB" in msg and "index='blocks'" in msg
    ds = ks.KlineDataset(store, window=16)         # auto: the block index
    assert not ds.keeps_full_index
    monkeypatch.setattr(block_feed, "available", lambda: tiny)
    with pytest.raises(InputError) as e:
        ds.loader(order="uniform")
    assert "\n" not in str(e.value) and "order='blocks'" in str(e.value)
    with pytest.raises(InputError, match="pool_blocks"):
        ds.loader(order="blocks")                   # even the pool does not fit in 1 MiB
    monkeypatch.undo()
    with pytest.raises(InputError, match="memmap"):
        ks.KlineDataset(store, window=16).loader(order="blocks", placement="device")


def test_symbol_days_keep_the_uniform_order(store):
    with pytest.raises(InputError, match="days='calendar'"):
        ks.KlineDataset(store, window=8, days="symbol", index="blocks")
    sym = ks.KlineDataset(store, window=8, days="symbol")
    assert sym.loader(batch_size=32).order == "uniform"
    with pytest.raises(InputError, match="order='blocks'"):
        sym.loader(order="blocks")


def test_available_reads_the_cgroup():
    a = memory.available()
    assert a.nbytes > 0 and a.source
    assert memory.gib(3 << 30) == "3.0 GiB"


_CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np, torch
    import kline_store as ks
    from kline_store.errors import InputError
    from kline_store import memory
    store, cg = sys.argv[1], sys.argv[2]
    st = ks.open_store(store, verify=False)
    memory.join_cgroup(__import__("pathlib").Path(cg))      # from here on, what we allocate is charged
    before = memory.private_bytes()
    out = {"available": str(memory.available())}
    try:
        ks.KlineDataset(store, window=32, index="full")
        out["full"] = "built"
    except InputError as e:
        out["full"] = str(e)
    ds = ks.KlineDataset(store, window=32)
    out["keeps_full"] = ds.keeps_full_index
    ld = ds.loader(batch_size=256, pool_blocks=64)
    out["order"] = ld.order
    n = 0
    for i, b in enumerate(ld):     # part of an epoch: the batches are right (checked above), memory stays bounded
        n += len(b["t"])
        if i == 2000:
            break
    seen = np.zeros(len(ds), dtype=bool)
    for idx in ld.batch_sampler:   # the rest of the epoch's order, positions only
        seen[idx] = True
    out.update(n=n, rest=int(seen.sum()), len=len(ds), grew=memory.private_bytes() - before)
    print(json.dumps(out))
""")


def test_store_bigger_than_a_cgroup_memory_limit(tmp_path):
    limit = 128 << 20     # new allocations only: what the child held before it joined is not charged
    store = make_store(tmp_path / "big", 400, 40000, seed=1)      # 384 MB of bars: 3x the limit
    cg = memory.make_cgroup(limit, f"kline-test-{os.getpid()}")
    if cg is None:
        pytest.skip("no writable memory cgroup (needs root and cgroup v1 memory or v2 with the memory controller)")
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        res = subprocess.run([sys.executable, "-c", _CHILD, str(store), str(cg[0])], capture_output=True,
                             text=True, env=env, timeout=600)
    finally:
        memory.remove_cgroup(cg[0])
    assert res.returncode == 0, f"rc={res.returncode} (-9: killed by the OOM killer) {res.stderr[-2000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "cgroup" in out["available"]
    assert out["full"] != "built" and "needs" in out["full"] and "index='blocks'" in out["full"]
    assert out["keeps_full"] is False and out["order"] == "blocks"
    assert out["n"] == 2001 * 256 and out["n"] + out["rest"] == out["len"]
    assert out["grew"] < limit


def test_residency_keeps_a_bounded_set_of_blocks(store):
    ds = ks.KlineDataset(store, window=16, index="blocks")
    ld = ds.loader(batch_size=64, order="blocks", pool_blocks=4, block_bytes=64 << 10, num_workers=0)
    res = ld.batch_sampler.residency
    plan = ld.batch_sampler.plan()
    assert plan.n_rounds > 2
    peak = 0
    for _ in ld:
        peak = max(peak, len(res.loaded))
    # the live pool, the next round's entering blocks and the last round's leaving ones, never the whole store
    assert 0 < peak <= 4 + 2 * max(1, 4 // block_feed.LIFETIME) + 4
    assert len(ds._index()._cache) <= 4 * plan.pool + 8


def test_segment_lookup_is_the_binary_search():
    """Positions to segments by table and steps, also over empty segments and runs of tiny ones."""
    from kline_store.samples.segments import SegmentLookup
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        counts = rng.integers(0, 5, n) * (rng.random(n) < rng.random())
        if rng.random() < 0.3:
            counts[rng.integers(0, n)] = rng.integers(100, 10_000)
        cum = np.r_[0, np.cumsum(counts)].astype(np.int64)
        if cum[-1] == 0:
            continue
        pos = np.r_[rng.integers(0, cum[-1], 500), 0, cum[-1] - 1]
        assert np.array_equal(SegmentLookup(cum)(pos), np.searchsorted(cum, pos, "right") - 1)
