"""buffers.py: the pinned staging ring waits for the copy that reads a slot; recycled CPU buffers are reused only
once nothing handed out from them is alive."""

from __future__ import annotations

import threading

import pytest
import torch

from kline_store.feed.buffers import HostRing, Recycler, numpy_dtype
from kline_store.errors import InputError


class FakeEvent:
    """A CUDA-event stand-in that completes only when the test says so."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.waited = False

    def synchronize(self) -> None:
        self.waited = True
        assert self.done.wait(5), "event never completed"


def test_ring_rotates_and_waits_for_copy_event():
    ring = HostRing(3, lambda: torch.zeros(4))  # CPU tensors standing in for pinned buffers
    assert len(ring) == 3 and len({id(b) for b in ring.buffers}) == 3
    got = [ring.acquire() for _ in range(3)]
    assert got == [0, 1, 2]
    events = [FakeEvent() for _ in range(3)]
    for k, ev in zip(got, events):
        ring.release(k, ev)
    result: list[int] = []
    th = threading.Thread(target=lambda: result.append(ring.acquire()))
    th.start()
    th.join(0.05)
    assert th.is_alive() and events[0].waited  # blocked on the copy still reading slot 0
    events[0].done.set()
    th.join(5)
    assert result == [0]
    empty = HostRing(1, lambda: None)
    empty.acquire()
    with pytest.raises(TimeoutError):
        empty.acquire(timeout=0.01)
    with pytest.raises(InputError):
        HostRing(0, lambda: None)
    shared = HostRing(3, lambda: None, buffers=ring.buffers)   # a new pass over the same buffers
    assert shared.buffers is ring.buffers and [shared.acquire() for _ in range(3)] == [0, 1, 2]


def test_recycler_reuses_only_released_buffers():
    rec = Recycler({"x": ((2,), torch.float32), "i": ((), torch.int64)}, capacity=4, max_slots=2)
    a = rec.take(4)
    a["x"].fill_(1.0)
    ptr = a["x"].data_ptr()
    kept = a["x"][1:3]  # a view the caller keeps: slot 0 must not be handed out again
    del a
    b = rec.take(3)
    assert b["x"].data_ptr() != ptr and b["x"].shape == (3, 2) and b["i"].dtype == torch.int64
    b["x"].fill_(2.0)
    assert float(kept.sum()) == 4.0  # untouched
    c = rec.take(4)  # both kept slots busy and max_slots reached: a fresh, unkept buffer
    assert len(rec.slots) == 2 and c["x"].data_ptr() not in (ptr, b["x"].data_ptr())
    del kept, b, c
    again = rec.take(4)
    assert again["x"].data_ptr() == ptr and rec.reused == 1


def test_numpy_dtypes():
    assert numpy_dtype(torch.bool).kind == "b" and numpy_dtype(torch.int64).itemsize == 8


def test_the_old_name_of_batch_layout_still_imports_with_a_warning():
    from kline_store.feed.source import BatchLayout
    with pytest.warns(DeprecationWarning, match="BatchLayout"):
        from kline_store.feed.source import Layout
    with pytest.warns(DeprecationWarning, match="BatchLayout"):
        from kline_store.feed.buffers import Layout as from_buffers
    assert Layout is BatchLayout and from_buffers is BatchLayout
