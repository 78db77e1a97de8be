"""loader.py: coverage of an epoch, one order whatever gathers it (inline, threads, fork and spawn processes, the
classic DataLoader recipe's keywords), epochs, resume, rank shards, options, buffers never overwritten while
held, a pass abandoned mid-epoch, and cross-section batches. Real threads and real worker processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel

from kline_store.feed import chunks
from kline_store.samples.cross_section import CrossSectionDataset
from kline_store.samples.dataset import KlineDataset
from kline_store.errors import InputError
from kline_store.feed.loader import KlineLoader, chunk_plan
from kline_store.measure.synthetic import make_store as synthetic_store


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    rng = np.random.default_rng(21)
    path = make_store(tmp_path_factory.mktemp("loader") / "s", random_panel(rng, 12, 150, holes=0.05))
    return KlineDataset(path, window=10, horizon=2)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few batches, so that small test stores exercise the chunked path."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 3 * 40 * (10 * 6 * 4 + 4 + 16))


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


def test_batches_equal_the_gather_of_their_indices(ds, small_chunks):
    ld = ds.loader(batch_size=40, seed=9)
    idx = list(ld.index_batches())
    got = list(ld)
    assert _same(got, [ds.gather_batch(i) for i in idx])


WORKERS = [
    {"num_workers": 1},
    {"num_workers": 2},
    {"num_workers": 4, "pin_memory": True, "prefetch_factor": 4, "persistent_workers": True},  # the recipe
    {"backend": "processes", "num_workers": 2, "multiprocessing_context": "fork"},
    {"backend": "processes", "num_workers": 1, "multiprocessing_context": "spawn", "timeout": 120},
]


@pytest.mark.parametrize("kw", WORKERS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_order_is_the_same_whatever_gathers_it(ds, small_chunks, kw):
    base = ds.loader(batch_size=50, seed=1, num_workers=0)
    want = [list(base), list(base)]                 # epochs 0 and 1
    ld = ds.loader(batch_size=50, seed=1, **kw)
    try:
        assert _same(list(ld), want[0])
        assert ld.epoch == 1
        assert _same(list(ld), want[1])             # persistent workers serve the next epoch
    finally:
        ld.close()


def test_threads_are_capped_at_the_cores(ds):
    ld = ds.loader(batch_size=8, num_workers=64)
    assert 1 <= ld.num_workers <= len(os.sched_getaffinity(0))
    assert ds.loader(batch_size=8, num_workers=0).num_workers == 0
    assert ds.loader(batch_size=8).num_workers >= 1   # default: gather threads
    assert ds.loader(batch_size=8, backend="processes", num_workers=3).num_workers == 3


def test_epochs_advance_and_set_epoch(ds):
    ld = ds.loader(batch_size=128, seed=0)
    assert ld.epoch == 0
    first = list(ld)
    assert ld.state_dict()["epoch"] == 1 and ld.state_dict()["position"] == 0
    second = list(ld)
    assert _keys(first) != _keys(second)
    ld.set_epoch(0)
    assert _same(list(ld), first)
    other = ds.loader(batch_size=128, seed=0)
    for e in range(2):
        other.set_epoch(e)
        assert _same(list(other), [first, second][e])


@pytest.mark.parametrize("kw", [{"num_workers": 0}, {"num_workers": 2, "prefetch_factor": 4},
                                {"backend": "processes", "num_workers": 2, "multiprocessing_context": "fork"}],
                         ids=["inline", "threads", "processes"])
def test_resume_yields_exactly_the_remaining_batches(ds, small_chunks, kw):
    full = list(ds.loader(batch_size=40, seed=7, num_workers=0))
    ld = ds.loader(batch_size=40, seed=7, **kw)
    head = []
    for b in ld:  # gathered ahead of this point; only delivered batches count
        head.append(b)
        if len(head) == 5:
            state = ld.state_dict()
            break
    time.sleep(0.05)   # producers run ahead meanwhile; the position must not
    assert ld.state_dict() == state
    ld.close()
    assert state["position"] == 200 and state["epoch"] == 0
    fresh = ds.loader(batch_size=40, seed=7, **kw)
    fresh.load_state_dict(state)
    fresh.set_epoch(0)  # a resumed training loop calls it again: keeps the position
    tail = list(fresh)
    fresh.close()
    assert _same(head + tail, full)
    done = ds.loader(batch_size=40, seed=7)
    done.load_state_dict({**state, "position": len(ds)})
    assert list(done) == [] and done.epoch == 1
    with pytest.raises(InputError, match="seed"):
        ds.loader(batch_size=40, seed=8).load_state_dict(state)


def test_a_pass_abandoned_mid_epoch_does_not_disturb_the_next(ds, small_chunks):
    want = list(ds.loader(batch_size=16, seed=3, num_workers=0))
    ld = ds.loader(batch_size=16, seed=3, num_workers=2, prefetch_factor=2)
    for _ in range(3):
        it = iter(ld)
        next(it)
        it.close()          # the training loop breaks out; threads stop, buffers come back
    ld.set_epoch(0)
    ld.load_state_dict({"epoch": 0, "position": 0})
    assert _same(list(ld), want)


def test_batches_kept_by_the_caller_are_never_overwritten(ds, small_chunks):
    ld = ds.loader(batch_size=16, seed=4, num_workers=2)
    kept = list(ld)         # every batch held at once: the recycler must hand out fresh buffers
    again = list(ld)        # another epoch gathered meanwhile
    ld.set_epoch(0)
    ref = list(ds.loader(batch_size=16, seed=4, num_workers=0))
    assert _same(kept, ref) and len(again) == len(ref)


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


def _cells(batch: dict, keep: torch.Tensor | None = None) -> list[tuple[int, ...]]:
    """A batch's samples as (symbol, t) for windows or (t,) for days, those of ``keep`` only."""
    keep = torch.ones(len(batch["t"]), dtype=torch.bool) if keep is None else keep
    if batch["t"].dim() == 1 and "mask" in batch:   # cross-sections: one item per day
        return [(int(t),) for t in batch["t"][keep]]
    return [(int(s), int(t)) for s, t in zip(batch["symbol"][keep], batch["t"][keep])]


@pytest.mark.parametrize("order", ["uniform", "blocks"])
@pytest.mark.parametrize("kind", ["windows", "days"])
def test_evaluation_over_three_ranks_counts_each_sample_once(ds, order, kind):
    """3 ranks over a dataset whose length is not a multiple of 3: the windows not marked ``padded`` under the
    default tail, and the windows of ``tail="uneven"``, are every window exactly once."""
    src = ds if kind == "windows" else CrossSectionDataset(ds)
    n, world = len(src), 3
    assert n % world, "the test needs a length that is not a multiple of 3"
    every = sorted(_cells(src.gather_batch(np.arange(n))))
    for shuffle in (True, False):
        opts = dict(batch_size=7, shuffle=shuffle, seed=3, world_size=world, order=order, num_workers=0)
        padded = [list(src.loader(rank=r, **opts)) for r in range(world)]
        assert len({len(b) for b in padded}) == 1          # training's default: the same steps on every rank
        marked = [bool(m) for bs in padded for b in bs for m in b["padded"]]
        assert sum(marked) == -(-n // world) * world - n > 0
        kept = [c for bs in padded for b in bs for c in _cells(b, ~b["padded"])]
        assert sorted(kept) == every                        # each window once, the repeats marked
        assert all(b["padded"].dtype == torch.bool and b["padded"].shape == b["t"].shape for bs in padded for b in bs)
        uneven = [list(src.loader(rank=r, tail="uneven", **opts)) for r in range(world)]
        assert sorted(c for bs in uneven for b in bs for c in _cells(b)) == every
        assert all("padded" not in b for bs in uneven for b in bs)
        sizes = [sum(len(b["t"]) for b in bs) for bs in uneven]
        steps = [len(bs) for bs in uneven]
        assert max(sizes) - min(sizes) == 1 and max(steps) - min(steps) <= 1
        assert [len(src.loader(rank=r, tail="uneven", **opts)) for r in range(world)] == steps
    one = next(iter(src.loader(batch_size=7, num_workers=0)))
    assert "padded" not in one                              # one rank repeats nothing: the plain batch


def test_padded_flag_survives_resume_and_threads(ds, small_chunks):
    world = 3
    for r in range(world):
        whole = list(ds.loader(batch_size=16, seed=1, rank=r, world_size=world, num_workers=2))
        ld = ds.loader(batch_size=16, seed=1, rank=r, world_size=world, num_workers=2)
        it = iter(ld)
        head = [next(it) for _ in range(len(whole) - 1)]
        again = ds.loader(batch_size=16, seed=1, rank=r, world_size=world, num_workers=2)
        again.load_state_dict(ld.state_dict())
        tail = list(again)
        assert _same(head + tail, whole)
        assert bool(whole[-1]["padded"][-1]) == (r >= len(ds) % world)


def _y_only(batch: dict) -> torch.Tensor:
    return batch["y"] * 2


@pytest.mark.parametrize("kw", [{"num_workers": 0}, {"num_workers": 2},
                                {"backend": "processes", "num_workers": 1, "multiprocessing_context": "fork"}],
                         ids=["inline", "threads", "processes"])
def test_collate_fn_applies_to_each_batch(ds, small_chunks, kw):
    ld = ds.loader(batch_size=30, seed=2, collate_fn=_y_only, **kw)
    got = list(ld)
    ld.close()
    want = [b["y"] * 2 for b in ds.loader(batch_size=30, seed=2, num_workers=0)]
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    assert ld.state_dict()["epoch"] == 1


def test_options(ds):
    with pytest.raises(InputError, match="sampler"):
        ds.loader(sampler=None)
    with pytest.raises(InputError, match="unknown argument.*shuffles"):
        ds.loader(shuffles=True)
    with pytest.raises(InputError, match="in_order"):
        ds.loader(num_workers=2, in_order=False)
    with pytest.raises(InputError, match="placement must be one of"):
        ds.loader(placement="gpu")
    with pytest.raises(InputError, match="pinned"):
        ds.loader(placement="pinned")
    with pytest.raises(InputError, match="backend"):
        ds.loader(backend="fibers")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA is not available"):
            ds.loader(device="cuda")
    assert isinstance(KlineLoader(ds, batch_size=8), KlineLoader)
    ld = ds.loader(batch_size=8, num_workers=2, prefetch_factor=5, config={"num_workers": 1, "prefetch": 3})
    assert (ld.config["num_workers"], ld.config["prefetch"], ld.config_source) == (2, 5, "given")
    assert ld.config["pin_memory"] is False and ld.placement == "memmap" and ld.device.type == "cpu"
    assert "memmap" in repr(ld)


def test_auto_config_reads_the_tuned_file(ds):
    from kline_store.feed.config import save_config

    cfg = {"backend": "threads", "num_workers": 1, "prefetch": 8, "pin_memory": False}
    path = save_config(ds.path, 10, 64, "cpu", cfg)
    try:
        ld = ds.loader(batch_size=64, config="auto")
        assert ld.config == cfg and ld.config_source == "tuned"
        assert ds.loader(batch_size=32, config="auto").config_source == "default"   # another key
    finally:
        path.unlink()


def test_chunk_plan_ramps_up_then_stays_full():
    batches = [np.arange(i * 5, i * 5 + 5) for i in range(12)] + [np.arange(60, 62)]
    plan = list(chunk_plan(iter(batches), per_chunk=4))
    assert [sizes for _, sizes in plan] == [[5], [5, 5], [5] * 4, [5] * 4, [5, 2]]
    assert np.array_equal(np.concatenate([idx for idx, _ in plan]), np.concatenate(batches))
    assert [s for _, s in chunk_plan(iter(batches[:3]), per_chunk=1)] == [[5], [5], [5]]


def test_close_stops_worker_processes(ds):
    ld = ds.loader(batch_size=64, backend="processes", num_workers=2, multiprocessing_context="fork")
    next(iter(ld))
    assert len(mp.active_children()) >= 2
    ld.close()
    deadline = time.monotonic() + 20
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mp.active_children() == []


def test_cross_section_loader(ds):
    xs = CrossSectionDataset(ds)
    for kw in ({"num_workers": 2}, {"backend": "processes", "num_workers": 2, "multiprocessing_context": "fork"}):
        ld = xs.loader(batch_size=8, seed=0, **kw)
        batches = list(ld)
        ld.close()
        days = [int(t) for b in batches for t in b["t"]]
        assert sorted(days) == xs.days.tolist()
        assert sum(int(b["mask"].sum()) for b in batches) == len(ds)
        b = batches[0]
        k = int(np.searchsorted(xs.days, int(b["t"][0])))
        n = int(b["mask"][0].sum())
        assert torch.equal(b["x"][0, :n], xs[k]["x"]) and torch.equal(b["symbol"][0, :n], xs[k]["symbol"])
    again = xs.loader(batch_size=8, seed=0)
    it = iter(again)
    head = [next(it) for _ in range(2)]
    state = again.state_dict()
    rest = xs.loader(batch_size=8, seed=0)
    rest.load_state_dict(state)
    assert _same(head + list(rest), batches)
    with pytest.raises(InputError, match="placement='device' needs"):
        xs.loader(batch_size=3, placement="device")


def test_a_script_that_stops_mid_epoch_exits_cleanly(tmp_path):
    """Leaving the loop and ending the script while gathers and the next epoch's shuffle still run in the
    background: threads in torch kernels at interpreter finalisation once aborted the process (exit 134)."""
    path = synthetic_store(tmp_path / "big", 1500, 2500)   # 3.7M windows: the next order takes a while
    head = f"import gc\nimport kline_store as ks\nds = ks.KlineDataset({str(path)!r}, window=16)\n"
    scripts = [  # leave the loop and end; drop the loader first (its threads outlive it), then end
        "for i, b in enumerate(ds.loader(batch_size=64, shuffle=True)):\n    if i == 20:\n        break\n",
        "ld = ds.loader(batch_size=64, shuffle=True)\nit = iter(ld)\nnext(it)\ndel it, ld\ngc.collect()\n"]
    for k, body in enumerate(scripts):
        script = tmp_path / f"stop{k}.py"
        script.write_text(head + body + "print('stopped')\n")
        for _ in range(2):   # the abort was a race: more than one run each
            r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0 and r.stdout.strip() == "stopped", (k, r.returncode, r.stderr[-500:])
            assert "terminate called" not in r.stderr


def test_every_background_thread_is_joined_at_exit(ds, small_chunks):
    """Gather, order and read-ahead threads are tracked by background.py (which joins them before the
    interpreter finalises), also once their loader is gone; the exit hook leaves none running."""
    import threading

    from kline_store.system import background
    ld = KlineLoader(ds, batch_size=8, shuffle=True, num_workers=2)
    it = iter(ld)
    next(it)
    ours = [t for t in threading.enumerate() if t.name.startswith(("kline-prefetch", "kline-order"))]
    assert ours and all(t in background._threads for t in ours)
    del it, ld
    background._stop_all()
    assert not any(t.is_alive() for t in ours)
    background.stopping.clear()   # the rest of the session goes on
