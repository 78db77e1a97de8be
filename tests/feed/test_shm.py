"""shm.py: a worker's ring slot pickles as a few numbers, unpickles as tensors viewing the slot, and the slot is
free again only when the last view is gone."""

from __future__ import annotations

import gc
import pickle

import torch
from multiprocessing.reduction import ForkingPickler

from kline_store.feed import shm

LAYOUT = {"x": ((3, 2), torch.float32), "t": ((), torch.int64), "m": ((3,), torch.bool)}


def _roundtrip(obj):
    return pickle.loads(ForkingPickler.dumps(obj))


def test_ring_handoff_roundtrip_and_release():
    ring = shm.WorkerRing(LAYOUT, capacity=4, n_slots=2)
    slot = ring.take(4)
    assert slot == 0 and ring.flags[0] == 1
    out = ring.tensors(slot, 3)
    out["x"].copy_(torch.arange(18.0).reshape(3, 3, 2))
    out["t"].copy_(torch.tensor([7, 8, 9]))
    out["m"].copy_(torch.tensor([[1, 0, 1]] * 3, dtype=torch.bool))
    blob = ForkingPickler.dumps(ring.handoff(slot, 3))
    assert len(blob) < 2000                                   # a few numbers, not the data
    got = pickle.loads(blob)
    assert type(got) is dict and torch.equal(got["x"], out["x"]) and got["t"].tolist() == [7, 8, 9]
    assert got["m"].dtype == torch.bool and got["x"].shape == (3, 3, 2)
    view = got["x"][1:]                                        # a view outlives the batch dict
    del got
    gc.collect()
    assert ring.flags[0] == 1                                  # still read through `view`
    del view
    gc.collect()
    assert ring.flags[0] == 0                                  # free again


def test_ring_is_full_or_too_small():
    ring = shm.WorkerRing(LAYOUT, capacity=4, n_slots=2)
    assert ring.take(5) is None                                # a batch bigger than a slot
    a, b = ring.take(4), ring.take(4)
    assert {a, b} == {0, 1} and ring.take(1) is None           # every slot busy: the caller sends plain tensors
    second = _roundtrip(ring.handoff(b, 1))                    # the descriptor was sent with the first batch
    assert second["t"].shape == (1,)
