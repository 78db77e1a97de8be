"""block_order.py and block_feed.py: the block order's properties, exhaustively on small block tables."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError
from kline_store.feed import block_order
from kline_store.feed import sampling
from kline_store.feed.block_feed import BlockBatches
from kline_store.measure.shuffle import coverage, expected_distinct, per_batch_distinct

counts_st = st.lists(st.integers(0, 40), min_size=0, max_size=60).map(lambda c: np.array(c, dtype=np.int64))


def epoch(counts, seed, ep, rank, world, tail, pool, lifetime=4, shuffle=True, batch=7, drop_last=False):
    s = BlockBatches(counts, batch, shuffle, seed, drop_last, rank, world, tail, pool, lifetime)
    s.set_epoch(ep)
    return s, [b.copy() for b in s]


@settings(max_examples=200, deadline=None)
@given(counts=counts_st, world=st.integers(1, 5), seed=st.integers(0, 3), ep=st.integers(0, 2),
       tail=st.sampled_from(sampling.TAILS), pool=st.integers(1, 12), shuffle=st.booleans())
def test_exactly_once_disjoint_ranks_same_steps(counts, world, seed, ep, tail, pool, shuffle):
    n = int(counts.sum())
    orders = []
    for r in range(world):
        _, bs = epoch(counts, seed, ep, r, world, tail, pool, shuffle=shuffle)
        o = np.concatenate(bs) if bs else np.zeros(0, np.int64)
        assert len(o) == sampling.shard_size(n, world, tail, r)   # every rank the same number of steps, but "uneven"
        orders.append(o[~sampling.padded(0, len(o), n, r, world, tail)] if tail == "pad" else o)
    cov = coverage(orders, n)
    if tail != "drop":   # "uneven", and "pad" without the samples marked padded: every window exactly once
        assert cov["repeated"] == 0 and cov["overlap"] == 0 and cov["missing"] == 0
    if tail == "drop":
        assert cov["repeated"] == 0 and cov["overlap"] == 0 and cov["missing"] == n % world
    elif tail == "pad":
        assert sampling.shard_size(n, world, "pad") * world - n < world     # at most world - 1 windows twice


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, world=st.integers(1, 4), seed=st.integers(0, 3), pool=st.integers(1, 12),
       batch=st.integers(1, 9), stop=st.integers(0, 30), batch2=st.integers(1, 9), drop_last=st.booleans())
def test_deterministic_and_resumes_exactly(counts, world, seed, pool, batch, stop, batch2, drop_last):
    for r in range(world):
        s1, full = epoch(counts, seed, 1, r, world, "pad", pool, batch=batch, drop_last=drop_last)
        _, again = epoch(counts, seed, 1, r, world, "pad", pool, batch=batch, drop_last=drop_last)
        assert all(np.array_equal(a, b) for a, b in zip(full, again)) and len(full) == len(again)
        assert len(full) == len(s1)
        flat = np.concatenate(full) if full else np.zeros(0, np.int64)
        k = min(stop, len(full))
        s1.set_epoch(1)
        s1.advance(sum(len(b) for b in full[:k]))
        state = s1.state_dict()
        b2 = batch if drop_last else batch2   # drop_last: another batch size drops another tail
        s2 = BlockBatches(counts, b2, True, seed, drop_last, r, world, "pad", pool, 4)
        s2.load_state_dict(state)
        rest = list(s2)
        got = np.concatenate(rest) if rest else np.zeros(0, np.int64)
        done = sum(len(b) for b in full[:k])
        if k == len(full):   # the epoch rolled over: the state is the next epoch's start
            assert state["position"] == 0
        else:
            want = flat[done:] if not drop_last else flat[done: s1.samples_per_epoch()]
            assert np.array_equal(got[: len(want)], want)


def test_order_depends_on_seed_epoch_rank_only():
    c = np.full(200, 30)
    a = epoch(c, 1, 0, 0, 1, "pad", 16)[1]
    assert not np.array_equal(np.concatenate(a), np.concatenate(epoch(c, 1, 1, 0, 1, "pad", 16)[1]))
    assert not np.array_equal(np.concatenate(a), np.concatenate(epoch(c, 2, 0, 0, 1, "pad", 16)[1]))
    # the batch size never changes the order: the same sequence cut differently
    b = epoch(c, 1, 0, 0, 1, "pad", 16, batch=64)[1]
    assert np.array_equal(np.concatenate(a), np.concatenate(b))


def test_rank_share_fixed_across_epochs():
    """A node reads the same blocks every epoch (from its own page cache after the first), in another order."""
    c = np.random.default_rng(0).integers(1, 50, 300)
    off = block_order.offsets(c)
    shares = []
    for r in range(3):
        orders = [np.concatenate(epoch(c, 5, e, r, 3, "drop", 20)[1]) for e in (0, 1)]
        assert len(set(orders[0].tolist()) ^ set(orders[1].tolist())) <= 2   # the dropped tail window may differ
        assert not np.array_equal(orders[0], orders[1])
        shares.append(set((np.searchsorted(off, orders[0], "right") - 1).tolist()))
    # whole blocks: only a block cut between two ranks is shared
    assert sum(map(len, shares)) - len(set.union(*shares)) <= 2


def test_pool_independent_of_batch_and_live_blocks_bounded():
    c = np.full(500, 40)
    plan = block_order.RoundPlan(block_order.rank_pieces(c, 0), 0, 0, 0, pool=64, lifetime=8)
    assert plan.n_rounds > 1
    for r in range(plan.n_rounds):
        assert len(plan.blocks(r)) <= 64
    assert len(plan.blocks(plan.n_rounds // 2)) == 64     # the pool is full in the middle
    assert len(plan.blocks(0)) == 64                       # and from the first round on


def test_distinct_blocks_per_batch_near_formula():
    c = np.full(4000, 100)     # equal blocks of 100 windows
    off = block_order.offsets(c)
    pool, b = 1024, 128
    order = np.concatenate([block_order.RoundPlan(block_order.rank_pieces(c, 0), 0, 0, 0, pool).round_positions(r)
                            for r in range(6, 12)])
    blocks = np.searchsorted(off, order, "right") - 1
    got = per_batch_distinct(blocks, b).mean()
    assert abs(got - expected_distinct(pool, b)) < 0.03 * b
    assert expected_distinct(8 * 512, 512) / 512 > 0.93


def test_small_share_is_one_uniform_round_and_shuffle_off_is_sequential():
    c = np.array([3, 0, 5, 2])
    plan = block_order.RoundPlan(block_order.rank_pieces(c, 0), 0, 0, 0, pool=10)
    assert plan.n_rounds == 1 and sorted(plan.round_positions(0).tolist()) == list(range(10))
    _, bs = epoch(c, 0, 0, 0, 1, "pad", 2, shuffle=False, batch=4)
    assert np.concatenate(bs).tolist() == list(range(10))


def test_state_of_another_order_is_refused():
    s = BlockBatches(np.full(10, 5), 4, pool=4)
    with pytest.raises(InputError, match="order='uniform'"):
        s.load_state_dict({"epoch": 0, "position": 0})
    u = sampling.EpochBatches(50, 4)
    with pytest.raises(InputError, match="order='blocks'"):
        u.load_state_dict(s.state_dict())
    with pytest.raises(InputError, match="pool"):
        BlockBatches(np.full(10, 5), 4, pool=8).load_state_dict(s.state_dict())


def test_group_segments():
    t = np.arange(12).reshape(2, 6)
    assert block_order.group_segments(t, 4).tolist() == [0 + 1 + 2 + 3, 4 + 5, 6 + 7 + 8 + 9, 10 + 11]


def test_rounds_computed_ahead_are_the_rounds():
    """The next round's positions come from a background thread: the same arrays, in order or from a resume."""
    from kline_store.feed.block_feed import RoundsAhead
    counts = np.random.default_rng(3).integers(0, 50, 200)
    plan = block_order.RoundPlan(block_order.rank_pieces(counts, 1), 1, 2, 0, pool=16, lifetime=4)
    assert plan.n_rounds > 5
    ahead = RoundsAhead(plan)
    for r in [0, 1, 2, 4, 5, 3] + list(range(plan.n_rounds)):
        assert np.array_equal(ahead.take(r), plan.round_positions(r))
