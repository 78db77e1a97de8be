"""sampling.py: permutations, rank shards, batches and resumption, exhaustively on small sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.feed import sampling
from kline_store.errors import InputError


def test_permutation_depends_on_seed_and_epoch_only():
    a = sampling.permutation(1000, 7, 3)
    assert np.array_equal(a, sampling.permutation(1000, 7, 3))
    assert sorted(a.tolist()) == list(range(1000)) and a.dtype == np.int32   # 4 bytes per window
    assert sampling.index_dtype(2**31) == np.int64 and sampling.index_dtype(2**31 - 1) == np.int32
    assert not np.array_equal(a, sampling.permutation(1000, 7, 4))
    assert not np.array_equal(a, sampling.permutation(1000, 8, 3))
    assert np.array_equal(sampling.epoch_order(5, 1, 2, shuffle=False), np.arange(5))


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 60), world=st.integers(1, 7), seed=st.integers(0, 5), epoch=st.integers(0, 3),
       tail=st.sampled_from(sampling.TAILS), shuffle=st.booleans())
def test_shards_partition_the_epoch(n, world, seed, epoch, tail, shuffle):
    shards = [sampling.rank_indices(n, seed, epoch, r, world, shuffle, tail) for r in range(world)]
    assert [len(x) for x in shards] == [sampling.shard_size(n, world, tail, r) for r in range(world)]
    sizes = {len(x) for x in shards}
    allx = np.concatenate(shards) if shards else np.zeros(0, np.int64)
    if tail == "uneven":   # disjoint and covering: each sample once; ranks differ by at most one sample
        assert sorted(allx.tolist()) == list(range(n)) and max(sizes) - min(sizes) <= 1
        assert all(not sampling.padded(0, len(x), n, r, world, tail).any() for r, x in enumerate(shards))
        return
    assert sizes == {sampling.shard_size(n, world, tail)}  # every rank runs the same number of steps
    if tail == "pad":      # the samples not marked padded: each exactly once
        own = [x[~sampling.padded(0, len(x), n, r, world, tail)] for r, x in enumerate(shards)]
        assert sorted(np.concatenate(own).tolist()) == list(range(n))
    if tail == "drop":
        assert len(set(allx.tolist())) == len(allx) == (n // world) * world  # disjoint
        assert set(allx.tolist()) == set(sampling.epoch_order(n, seed, epoch, shuffle)[: len(allx)].tolist())
    else:
        assert set(allx.tolist()) == set(range(n))  # covering
        counts = np.bincount(allx, minlength=n) if n else np.zeros(0)
        if n >= world:
            assert counts.max(initial=0) <= 2 and (counts == 2).sum() == len(allx) - n < world


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 50), bs=st.integers(1, 9), drop_last=st.booleans(), data=st.data())
def test_batches_resume_from_any_position(n, bs, drop_last, data):
    idx = np.arange(100, 100 + n)
    full = list(sampling.batches(idx, bs, drop_last))
    assert len(full) == sampling.n_batches(n, bs, drop_last)
    assert all(len(b) == bs for b in full[:-1])
    flat = np.concatenate(full) if full else np.zeros(0, np.int64)
    assert np.array_equal(flat, idx[: len(flat)]) and (drop_last or len(flat) == n)
    k = data.draw(st.integers(0, len(full)))
    rest = list(sampling.batches(idx, bs, drop_last, position=k * bs))
    assert len(rest) == len(full) - k and all(np.array_equal(a, b) for a, b in zip(rest, full[k:]))


def _drain(eb: sampling.EpochBatches) -> list[np.ndarray]:
    out = []
    for b in eb:
        out.append(b)
        eb.advance(len(b))
    return out


def test_epoch_batches_state_and_rollover():
    eb = sampling.EpochBatches(23, 5, shuffle=True, seed=4)
    assert len(eb) == 5 and eb.remaining() == 5
    first = list(eb)  # iterating does not advance
    assert eb.position == 0 and len(first) == 5
    eb.advance(10)
    state = eb.state_dict()
    assert state["epoch"] == 0 and state["position"] == 10 and state["seed"] == 4
    again = sampling.EpochBatches(23, 5, shuffle=True, seed=4)
    again.load_state_dict(state)
    rest = _drain(again)
    assert all(np.array_equal(a, b) for a, b in zip(rest, first[2:])) and len(rest) == 3
    assert again.epoch == 1 and again.position == 0  # the last batch rolled the epoch over
    nxt = list(again)
    assert not np.array_equal(np.concatenate(nxt), np.concatenate(first))  # a new permutation
    # set_epoch: a no-op for the current epoch (keeps a resumed position), a fresh start otherwise
    again.advance(5)
    again.set_epoch(1)
    assert again.position == 5
    again.set_epoch(3)
    assert (again.epoch, again.position) == (3, 0)
    # a different batch size resumes at the same sample
    eb2 = sampling.EpochBatches(23, 4, shuffle=True, seed=4)
    eb2.load_state_dict(state)
    assert np.array_equal(np.concatenate(list(eb2)), np.concatenate(first)[10:])


def test_epoch_batches_reject_a_foreign_state():
    eb = sampling.EpochBatches(10, 3, seed=1, rank=0, world_size=2)
    for key, value in [("n", 11), ("seed", 2), ("world_size", 1), ("shuffle", False), ("tail", "drop")]:
        with pytest.raises(InputError, match=key):
            eb.load_state_dict({**eb.state_dict(), key: value})
    with pytest.raises(InputError, match="position"):
        eb.load_state_dict({**eb.state_dict(), "position": 99})
    with pytest.raises(InputError, match="lacks"):
        eb.load_state_dict({})


@pytest.mark.parametrize("key,value", [("epoch", -1), ("epoch", float("nan")), ("position", float("inf")),
                                       ("position", "3"), ("epoch", None), ("epoch", 1.5), ("position", True)])
def test_odd_values_in_a_state_are_one_line(key, value):
    """Issue 19: epoch -1 or NaN raised raw numpy errors."""
    eb = sampling.EpochBatches(10, 3, seed=1)
    with pytest.raises(InputError, match=rf"loader state has {key}=.*expected a whole number >= 0"):
        eb.load_state_dict({**eb.state_dict(), key: value})
    eb.load_state_dict({**eb.state_dict(), "epoch": np.int64(2), "position": 3.0})   # numbers as saved
    assert eb.epoch == 2 and eb.position == 3


@pytest.mark.parametrize("kwargs", [dict(batch_size=0), dict(rank=2, world_size=2), dict(world_size=0),
                                    dict(tail="wrap")])
def test_epoch_batches_bad_arguments(kwargs):
    args = dict(n=10, batch_size=2)
    args.update(kwargs)
    with pytest.raises(InputError):
        sampling.EpochBatches(**args)


def test_ranks_cover_the_epoch_with_drop_last_batches():
    world, n, bs = 3, 50, 4
    ranks = [sampling.EpochBatches(n, bs, seed=9, drop_last=True, rank=r, world_size=world) for r in range(world)]
    got = [np.concatenate(list(eb)) for eb in ranks]
    assert {len(g) for g in got} == {16} and {len(eb) for eb in ranks} == {4}
    assert len(set(np.concatenate(got).tolist())) == 48


@pytest.mark.parametrize("order", ["uniform", "blocks"])
def test_both_orders_share_one_resumable_state(order):
    """EpochBatches and BlockBatches keep their position and state in ResumableOrder: the same keys, the same
    epoch roll-over, the same checks of a state given back."""
    from kline_store.feed.block_feed import BlockBatches

    make = (lambda: sampling.EpochBatches(50, 8, True, 3)) if order == "uniform" else \
        (lambda: BlockBatches(np.full(5, 10), 8, True, 3, pool=2, lifetime=2))
    s = make()
    assert isinstance(s, sampling.ResumableOrder) and s.order == order and s.residency is None
    shared = ["epoch", "seed", "position", "n", "shuffle", "rank", "world_size", "tail", "batch_size", "drop_last"]
    assert list(s.state_dict())[:len(shared)] == shared
    s.advance(16)
    state = s.state_dict()
    again = make()
    again.load_state_dict(state)
    assert (again.epoch, again.position, len(again), again.remaining()) == (0, 16, 7, 5)
    again.advance(34)
    assert (again.epoch, again.position) == (1, 0)
    for bad, match in [([1], "is a list"), ({**state, "position": -1}, "position=-1"),
                       ({**state, "seed": 4}, "seed=4"), ({**state, "position": 51}, "outside the epoch"),
                       ({**state, "order": "other"}, "order='other'")]:
        with pytest.raises(InputError, match=match):
            make().load_state_dict(bad)
