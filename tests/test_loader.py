"""loader.py: batch loader coverage, determinism across worker counts and start methods, epochs, resume,
rank shards, DataLoader options, cross-section batches and the device hook. Real DataLoader workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel

from kline_store.dataset import CrossSectionDataset, KlineDataset
from kline_store.errors import InputError
from kline_store.loader import KlineLoader


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    rng = np.random.default_rng(21)
    path = make_store(tmp_path_factory.mktemp("loader") / "s", random_panel(rng, 12, 150, holes=0.05))
    return KlineDataset(path, window=10, horizon=2)


def _keys(batches: list[dict]) -> list[tuple[int, int]]:
    return [(int(s), int(t)) for b in batches for s, t in zip(b["symbol"], b["t"])]


def _same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def _valid(ds: KlineDataset) -> set[tuple[int, int]]:
    s, t = ds.locate(np.arange(len(ds)))
    return set(zip(s.tolist(), t.tolist()))


def test_epoch_covers_every_window_once(ds):
    for shuffle in (True, False):
        ld = ds.loader(batch_size=64, shuffle=shuffle, seed=5)
        batches = list(ld)
        keys = _keys(batches)
        assert len(keys) == len(set(keys)) == len(ds) and set(keys) == _valid(ds)
        assert len(batches) == len(ld) == -(-len(ds) // 64)
        assert all(len(b["y"]) == 64 for b in batches[:-1])
        b = batches[0]
        assert b["x"].shape == (64, 10, 6) and b["symbol"].dtype == torch.int64 and b["t"].dtype == torch.int64
    assert _keys(list(ds.loader(batch_size=64, shuffle=False))) == sorted(_valid(ds))
    dropped = list(ds.loader(batch_size=64, drop_last=True))
    assert len(dropped) == len(ds) // 64 and all(len(b["y"]) == 64 for b in dropped)


def test_order_depends_on_seed_and_epoch_not_workers(ds):
    base = list(ds.loader(batch_size=50, seed=1))
    fork = list(ds.loader(batch_size=50, seed=1, num_workers=2, multiprocessing_context="fork",
                          prefetch_factor=3))
    assert _same(base, fork)
    assert _keys(list(ds.loader(batch_size=50, seed=2))) != _keys(base)
    ld = ds.loader(batch_size=50, seed=1)
    ld.set_epoch(1)
    e1 = list(ld)
    assert _keys(e1) != _keys(base) and set(_keys(e1)) == set(_keys(base))
    again = ds.loader(batch_size=50, seed=1, num_workers=1, multiprocessing_context="fork")
    again.set_epoch(1)
    assert _same(list(again), e1)


def test_spawn_workers_match_and_persist_over_epochs(ds):
    want = ds.loader(batch_size=100, seed=3)
    w0, w1 = list(want), list(want)  # the loader moves on to the next epoch by itself
    ld = ds.loader(batch_size=100, seed=3, num_workers=1, multiprocessing_context="spawn",
                   persistent_workers=True, timeout=120)
    assert _same(list(ld), w0)
    assert ld.epoch == 1
    assert _same(list(ld), w1)


def test_epochs_advance_and_set_epoch(ds):
    ld = ds.loader(batch_size=128, seed=0)
    assert ld.epoch == 0
    first = list(ld)
    assert ld.state_dict()["epoch"] == 1 and ld.state_dict()["position"] == 0
    second = list(ld)
    assert _keys(first) != _keys(second)
    ld.set_epoch(0)
    assert _same(list(ld), first)
    # the usual loop: set_epoch(e) each epoch sees permutation e
    other = ds.loader(batch_size=128, seed=0)
    for e in range(2):
        other.set_epoch(e)
        assert _same(list(other), [first, second][e])


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_yields_exactly_the_remaining_batches(ds, workers):
    full = list(ds.loader(batch_size=40, seed=7, num_workers=0))
    ld = ds.loader(batch_size=40, seed=7, num_workers=workers, prefetch_factor=4)
    head = []
    for b in ld:  # workers gather ahead of this point; only delivered batches count
        head.append(b)
        if len(head) == 5:
            state = ld.state_dict()
            break
    assert state["position"] == 200 and state["epoch"] == 0
    fresh = ds.loader(batch_size=40, seed=7, num_workers=workers)
    fresh.load_state_dict(state)
    fresh.set_epoch(0)  # a resumed training loop calls it again: keeps the position
    tail = list(fresh)
    assert _same(head + tail, full)
    # resumed at the end of an epoch: nothing is left, and the next iteration is the next epoch
    done = ds.loader(batch_size=40, seed=7)
    done.load_state_dict({**state, "position": len(ds)})
    assert list(done) == [] and done.epoch == 1
    with pytest.raises(InputError, match="seed"):
        ds.loader(batch_size=40, seed=8).load_state_dict(state)


def test_rank_shards(ds):
    world = 3
    shards = [list(ds.loader(batch_size=32, seed=4, rank=r, world_size=world)) for r in range(world)]
    keys = [_keys(s) for s in shards]
    assert len({len(s) for s in shards}) == 1  # same number of steps on every rank
    per_rank = -(-len(ds) // world)
    assert all(len(k) == per_rank for k in keys)
    union = [k for ks in keys for k in ks]
    assert set(union) == _valid(ds) and len(union) - len(set(union)) == per_rank * world - len(ds)
    dropped = [_keys(list(ds.loader(batch_size=32, seed=4, rank=r, world_size=world, tail="drop")))
               for r in range(world)]
    flat = [k for ks in dropped for k in ks]
    assert len(flat) == len(set(flat)) == (len(ds) // world) * world
    with pytest.raises(InputError, match="rank"):
        ds.loader(rank=3, world_size=3)


def test_dataloader_options_pass_through(ds):
    ld = ds.loader(batch_size=16, num_workers=2, pin_memory=False, prefetch_factor=5, persistent_workers=True,
                   timeout=30, multiprocessing_context="fork")
    dl = ld.dataloader
    assert (dl.num_workers, dl.prefetch_factor, dl.persistent_workers, dl.timeout) == (2, 5, True, 30)
    assert dl.multiprocessing_context.get_start_method() == "fork"
    assert ds.loader(prefetch_factor=2, persistent_workers=False).dataloader.num_workers == 0
    assert len(next(iter(ds.loader(batch_size=64, collate_fn=lambda b: b["y"])))) == 64
    with pytest.raises(InputError, match="sampler"):
        ds.loader(sampler=None)
    with pytest.raises(InputError, match="in_order"):
        ds.loader(num_workers=2, in_order=False)
    assert isinstance(KlineLoader(ds, batch_size=8), KlineLoader)


def test_index_batches_for_device_feeding(ds):
    ld = ds.loader(batch_size=30, seed=2)
    want = list(ds.loader(batch_size=30, seed=2))
    idx = list(ld.index_batches())
    assert len(idx) == len(ld) and ld.state_dict()["position"] == 0
    got = [ds.gather_batch(i) for i in idx]
    assert _same(got, want)
    ld.advance(60)
    assert np.array_equal(next(iter(ld.index_batches())), idx[2])


def test_device_hook(ds):
    plain = ds.loader(batch_size=64, seed=1)
    assert type(plain) is KlineLoader
    assert type(ds.loader(batch_size=64, placement="memmap")) is KlineLoader
    fed = ds.loader(batch_size=64, seed=1, device="cpu")
    assert type(fed) is not KlineLoader  # handed to kline_store.device.wrap_loader
    assert _same(list(fed), list(plain))


def test_cross_section_loader(ds):
    xs = CrossSectionDataset(ds)
    ld = xs.loader(batch_size=8, seed=0, num_workers=2, multiprocessing_context="fork")
    batches = list(ld)
    days = [int(t) for b in batches for t in b["t"]]
    assert sorted(days) == xs.days.tolist()
    total = sum(int(b["mask"].sum()) for b in batches)
    assert total == len(ds)
    b = batches[0]
    k = int(np.searchsorted(xs.days, int(b["t"][0])))
    n = int(b["mask"][0].sum())
    assert torch.equal(b["x"][0, :n], xs[k]["x"]) and torch.equal(b["symbol"][0, :n], xs[k]["symbol"])
    # resume over days as well
    again = xs.loader(batch_size=8, seed=0)
    it = iter(again)
    head = [next(it) for _ in range(2)]
    state = again.state_dict()
    rest = xs.loader(batch_size=8, seed=0)
    rest.load_state_dict(state)
    assert _same(head + list(rest), batches)
