"""samples/day_blocks.py and CrossSectionDataset's block order: the by-day table's positions from O(segments) counts,
every day exactly once per epoch over the ranks, the uniform order's multiset, an order of (seed, epoch, rank,
world) only, exact resume, fixed rank shares, threads and processes, one-line refusals. Small stores with segments
of a few days (``SEG_ROW_BYTES`` set low for this module), so that they hold dozens of blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store import memory
from kline_store.errors import InputError
from kline_store.feed import block_feed
from kline_store.feed import block_order
from kline_store.feed import sampling
from kline_store.measure import shuffle
from kline_store.measure.synthetic import make_store as synthetic_store
from kline_store.samples import day_blocks
from kline_store.samples.cross_section import CrossSectionDataset
from kline_store.samples.dataset import KlineDataset
from conftest import resumed

DAYS = 5   # days per segment in this module's stores


@pytest.fixture(scope="module", autouse=True)
def _small_segments(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(day_blocks, "SEG_ROW_BYTES", DAYS * 6 * 4)       # six fields: DAYS days of each row
        mp.setenv("KLINE_STORE_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return synthetic_store(tmp_path_factory.mktemp("xs") / "s", 30, 400, seed=4)   # late listings, suspensions


@pytest.fixture(scope="module")
def pair(store):
    """The same cross-sections with the by-day table and with day blocks."""
    opts = dict(window=10, horizon=2, min_count=3)
    return CrossSectionDataset(store, index="full", **opts), CrossSectionDataset(store, index="blocks", **opts)


def day_keys(batches):
    """Each delivered day as (t, its symbols), in delivery order."""
    return [(int(t), tuple(s[m].tolist())) for b in batches for t, s, m in zip(b["t"], b["symbol"], b["mask"])]


def positions(ld):
    parts = list(ld.index_batches())
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@pytest.mark.parametrize("opts", [dict(window=10, horizon=2), dict(window=6, missing="ffill", max_missing=2),
                                  dict(window=16, start="2010-03-01", end="2010-12-01", min_count=20),
                                  dict(window=8, symbols=["S00007", "S00003", "S00021"], label="log_return")])
def test_day_blocks_have_the_table_positions(store, opts):
    full = CrossSectionDataset(store, index="full", **opts)
    blk = CrossSectionDataset(store, index="blocks", **opts)
    assert full.keeps_full_index and not blk.keeps_full_index
    assert len(full) == len(blk) and np.array_equal(full.days, blk.days)
    idx = np.arange(len(full))
    for a, b in zip(full._day_windows(idx), blk._day_windows(idx)):
        assert np.array_equal(a, b)
    pick = np.random.default_rng(0).integers(0, len(full), 12)
    a, b = full.gather_batch(pick), blk.gather_batch(pick)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(full[i][k], blk[i][k]) for i in (0, len(full) - 1) for k in ("x", "y", "symbol"))
    assert blk._xs.nbytes * 8 < full._order.nbytes   # O(segments of days), not O(windows)


def test_counts_are_cached_once_per_store_version_and_spec(store, monkeypatch):
    a = CrossSectionDataset(store, window=12, index="blocks", min_count=2)

    def no_count(*args, **kw):
        raise AssertionError("counted again")

    monkeypatch.setattr(day_blocks.DayBlocks, "build", no_count)
    b = CrossSectionDataset(store, window=12, index="blocks", min_count=2)     # another rank, a restart
    assert np.array_equal(a._xs.counts, b._xs.counts)
    with pytest.raises(AssertionError, match="counted again"):
        CrossSectionDataset(store, window=12, index="blocks", min_count=5)    # another min_count: counted


@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 4), seed=st.integers(0, 3), tail=st.sampled_from(sampling.TAILS), pool=st.integers(1, 6),
       segs=st.integers(1, 3), batch=st.integers(1, 7), drop_last=st.booleans(), full=st.booleans())
def test_every_day_once_over_ranks_with_equal_steps(pair, world, seed, tail, pool, segs, batch, drop_last, full):
    xs = pair[0] if full else pair[1]
    n = len(xs)
    seg_bytes = xs.block_segments()[1]
    orders = []
    for r in range(world):
        ld = xs.loader(batch_size=batch, seed=seed, rank=r, world_size=world, tail=tail, drop_last=drop_last,
                       order="blocks", pool_blocks=pool, block_bytes=segs * seg_bytes, num_workers=0)
        assert ld.order == "blocks" and ld.batch_sampler.block_bytes == segs * seg_bytes
        o = positions(ld)
        k = sampling.shard_size(n, world, tail, r)
        assert len(ld) == sampling.n_batches(k, batch, drop_last)     # every rank the same number of steps, but "uneven"
        assert len(o) == (k // batch * batch if drop_last else k)
        orders.append(o)
    cov = shuffle.coverage(orders, n)
    if drop_last:   # the last partial batch of each rank left out
        assert cov["repeated"] == 0 or tail == "pad"
    elif tail == "uneven":
        assert cov["repeated"] == 0 and cov["overlap"] == 0 and cov["missing"] == 0
    elif tail == "drop":
        assert cov["repeated"] == 0 and cov["overlap"] == 0 and cov["missing"] == n % world
    else:
        assert cov["missing"] == 0 and cov["delivered"] - n < world


@settings(max_examples=10, deadline=None)
@given(world=st.integers(1, 3), seed=st.integers(0, 5), pool=st.integers(1, 6), segs=st.integers(1, 3),
       batch=st.integers(1, 9), stop=st.integers(0, 40), epoch=st.integers(0, 2))
def test_order_of_seed_epoch_rank_only_and_exact_resume(pair, world, seed, pool, segs, batch, stop, epoch):
    xs = pair[1]
    kw = dict(seed=seed, world_size=world, order="blocks", pool_blocks=pool,
              block_bytes=segs * xs.block_segments()[1], num_workers=0)
    for r in range(world):
        ld = xs.loader(batch_size=batch, rank=r, **kw)
        ld.set_epoch(epoch)
        whole = list(ld.index_batches())
        other = xs.loader(batch_size=batch + 1, rank=r, **kw)   # another loader, another batch size: the same
        other.set_epoch(epoch)
        flat = np.concatenate(whole)
        assert np.array_equal(flat, positions(other))
        k = min(stop, len(whole) - 1)
        ld.batch_sampler.advance(sum(len(b) for b in whole[:k]))
        state = ld.state_dict()
        resumed = xs.loader(batch_size=batch, rank=r, **kw)
        resumed.load_state_dict(state)
        assert state["epoch"] == epoch and np.array_equal(positions(resumed), flat[sum(map(len, whole[:k])):])


def test_rank_shares_fixed_across_epochs(pair):
    """A node reads the same runs of dates every epoch (from its own page cache after the first), in another
    order; the ranks' shares are whole blocks but at most one cut between two neighbours."""
    xs = pair[1]
    counts, seg_bytes = xs.block_segments()
    off = block_order.offsets(block_order.group_segments(counts, 2))
    world, shares = 3, []
    for r in range(world):
        ld = xs.loader(batch_size=4, seed=7, rank=r, world_size=world, tail="pad", order="blocks", pool_blocks=4,
                       block_bytes=2 * seg_bytes, num_workers=0)
        per_epoch = []
        for e in (0, 1):
            ld.set_epoch(e)
            per_epoch.append(positions(ld))
        assert not np.array_equal(per_epoch[0], per_epoch[1])
        assert set(per_epoch[0].tolist()) == set(per_epoch[1].tolist())
        blocks = [set((np.searchsorted(off, p, "right") - 1).tolist()) for p in per_epoch]
        assert blocks[0] == blocks[1]
        shares.append(blocks[0])
    assert sum(map(len, shares)) - len(set.union(*shares)) <= world - 1


def test_block_order_delivers_the_uniform_multiset_threads_and_processes(pair):
    full, blk = pair
    uni = day_keys(full.loader(batch_size=6, order="uniform", seed=1))
    ref = blk.loader(batch_size=6, order="blocks", pool_blocks=4, seed=1, num_workers=0)
    got = list(ref)
    assert sorted(uni) == sorted(day_keys(got)) and len(uni) == len(full)
    assert day_keys(got) != uni                                            # another order
    # one order whatever gathers it, and whichever index the dataset keeps
    for xs, kw in ((blk, dict(num_workers=2)), (full, dict(num_workers=0)),
                   (blk, dict(backend="processes", num_workers=2, multiprocessing_context="spawn"))):
        ld = xs.loader(batch_size=6, order="blocks", pool_blocks=4, seed=1, **kw)
        try:
            batches = list(ld)
        finally:
            ld.close()
        assert len(batches) == len(got)
        assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(batches, got))


def test_resume_mid_epoch_through_the_loader(pair):
    xs = pair[1]
    whole, head, again = resumed(lambda: xs.loader(batch_size=5, order="blocks", pool_blocks=3, seed=9), 11)
    assert day_keys(head) + day_keys(again) == day_keys(whole)


def test_auto_order_and_the_uniform_order_over_day_blocks(store, monkeypatch):
    xs = CrossSectionDataset(store, window=10, horizon=2, min_count=3)
    assert xs.keeps_full_index and xs.loader(batch_size=4).order == "uniform"
    small = memory.Available(xs.read_bytes(), "cgroup memory.max (test)")
    monkeypatch.setattr(block_feed, "available", lambda: small)
    ld = xs.loader(batch_size=4, pool_blocks=4)
    assert ld.order == "blocks" and ld.placement == "memmap"
    monkeypatch.undo()
    blk = CrossSectionDataset(store, window=10, horizon=2, min_count=3, index="blocks")
    ld = blk.loader(batch_size=4)                                          # keeps no table: blocks
    assert ld.order == "blocks" and ld.batch_sampler.pool == day_blocks.MIN_POOL
    assert blk.loader(batch_size=20).batch_sampler.pool == 160             # 8 x the batch size
    uni = blk.loader(batch_size=4, order="uniform", seed=2)                # builds the table now
    assert blk.keeps_full_index
    assert day_keys(uni) == day_keys(xs.loader(batch_size=4, order="uniform", seed=2))


def test_refusals_are_one_line(store, monkeypatch):
    tiny = memory.Available(1 << 16, "cgroup memory.max 64 KiB")
    monkeypatch.setattr(day_blocks, "available", lambda: tiny)
    with pytest.raises(InputError) as e:
        CrossSectionDataset(store, window=10, index="full")
    msg = str(e.value)
    assert "\n" not in msg and "needs" in msg and "64 KiB" in msg and "index='blocks'" in msg
    auto = CrossSectionDataset(store, window=10)            # the dataset's full index fits, the table does not
    assert not auto.keeps_full_index and auto.windows.keeps_full_index
    monkeypatch.setattr(block_feed, "available", lambda: tiny)
    with pytest.raises(InputError) as e:
        auto.loader(order="uniform")
    assert "\n" not in str(e.value) and "order='blocks'" in str(e.value)
    with pytest.raises(InputError, match="pool_blocks"):
        auto.loader(order="blocks")                         # even the pool does not fit
    monkeypatch.undo()
    with pytest.raises(InputError, match="days='calendar'"):
        CrossSectionDataset(store, window=8, days="symbol", index="blocks")
    with pytest.raises(InputError, match="order='blocks' needs"):
        CrossSectionDataset(store, window=8, days="symbol").loader(order="blocks")
    with pytest.raises(InputError, match="memmap"):
        CrossSectionDataset(store, window=8, index="blocks").loader(order="blocks", placement="pinned")


def test_residency_keeps_a_bounded_set_of_blocks(pair, monkeypatch):
    xs = CrossSectionDataset(pair[1].windows, min_count=3)   # a fresh one: nothing computed yet
    assert not xs.keeps_full_index
    seg = xs._xs.segment(0)
    cap = 6 * (seg[0].nbytes + seg[1].nbytes)
    monkeypatch.setattr(day_blocks, "CACHE_BYTES", cap)              # computed segments kept, whatever the timing
    ld = xs.loader(batch_size=3, order="blocks", pool_blocks=4, block_bytes=1, num_workers=0)
    res, plan = ld.batch_sampler.residency, ld.batch_sampler.plan()
    assert plan.n_rounds > 2
    peak = cached = 0
    for _ in ld:
        peak = max(peak, len(res.loaded))
        cached = max(cached, xs._xs._cached_bytes)
    # the live pool, the next round's entering blocks and the last round's leaving ones, never the whole store
    assert 0 < peak <= 4 + 2 * max(1, 4 // block_feed.LIFETIME) + 4
    assert cached <= cap + seg[0].nbytes + seg[1].nbytes
    res.close()
    res._thread.join(timeout=60)
    # what is left computed is the last round's blocks (released a round late: when the next epoch starts)
    assert set(xs._xs._cache) <= res.loaded and len(res.loaded) <= 4 + max(1, 4 // block_feed.LIFETIME)


def test_a_dataset_of_another_store_with_holes_in_every_field(tmp_path):
    rng = np.random.default_rng(3)
    path = make_store(tmp_path / "s", random_panel(rng, 9, 90, holes=0.15))
    ds = KlineDataset(path, window=5, horizon=1, index="blocks")
    blk, full = CrossSectionDataset(ds), CrossSectionDataset(KlineDataset(path, window=5, horizon=1))
    assert not blk.keeps_full_index and full.keeps_full_index
    assert np.array_equal(blk.days, full.days)
    a = day_keys(blk.loader(batch_size=3, order="blocks", pool_blocks=2, block_bytes=1, seed=4))
    assert sorted(a) == sorted(day_keys(full.loader(batch_size=3, order="uniform")))


def test_a_resumed_loader_takes_the_saved_block_size(pair, monkeypatch):
    """Blocks are sized from the available memory, which differs between a run and its restart: the state records
    the size and the restarted loader takes it, so the order resumes exactly; a different size given is refused."""
    xs = pair[1]
    seg = xs.block_segments()[1]
    monkeypatch.setattr(block_feed, "available", lambda: memory.Available(250_000, "test"))
    ld = xs.loader(batch_size=4, order="blocks", pool_blocks=4, seed=2, num_workers=0)
    assert ld.batch_sampler.block_bytes == 3 * seg
    whole = positions(ld)
    ld.batch_sampler.advance(40)
    state = ld.state_dict()
    assert state["block_bytes"] == 3 * seg
    monkeypatch.setattr(block_feed, "available", lambda: memory.Available(500_000, "test"))
    again = xs.loader(batch_size=4, order="blocks", pool_blocks=4, seed=2, num_workers=0)
    assert again.batch_sampler.block_bytes == 6 * seg
    again.load_state_dict(state)
    assert again.batch_sampler.block_bytes == 3 * seg and np.array_equal(positions(again), whole[40:])
    given = xs.loader(batch_size=4, order="blocks", pool_blocks=4, seed=2, block_bytes=6 * seg)
    with pytest.raises(InputError) as e:
        given.load_state_dict(state)
    assert "\n" not in str(e.value) and f"block_bytes={3 * seg}" in str(e.value)
