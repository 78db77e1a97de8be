"""Hand batches from DataLoader worker processes to the training process through a fixed ring of shared memory.

torch sends a tensor from a worker by moving it into a new shared-memory segment and passing its file descriptor
over a socket, about a millisecond per tensor: more than gathering the batch. Here each worker gathers straight
into one of a few slots of its own shared mapping (an anonymous memfd) and sends only ``(ring, slot, offsets)``;
the file descriptor crosses once per worker, with its first batch. The training process maps each ring once and
builds the batch's tensors as views of the slot. When the last tensor viewing a slot is freed (a finalizer on
the numpy buffer that every view keeps alive), the slot's flag in the ring's first page is cleared and the worker
may fill it again. A worker that finds no free slot (the trainer keeps many batches) sends plain tensors instead,
so nothing waits and nothing is overwritten while it is read.

Each ring belongs to an owner (the loader's process pool): :func:`release` drops the training process's mappings
of its rings when its workers end (an epoch without persistent workers) or the loader closes or is collected; a
mapping is unmapped when the last batch viewing it is freed. There is no cap on live rings.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
import time
import weakref
from multiprocessing.reduction import DupFd
from typing import Any

import numpy as np
import torch

from .buffers import numpy_dtype
from .source import BatchLayout

_ALIGN = 64
_HEADER = 4096        # slot flags: one byte per slot


def _round_up(n: int, k: int = _ALIGN) -> int:
    return -(-n // k) * k


class WorkerRing:
    """The worker's side: ``n_slots`` slots for ``capacity`` samples of ``layout`` each, in one shared mapping.

    Args:
        layout: ``{key: (shape of one sample, torch dtype)}``.
        capacity: samples per slot.
        n_slots: slots (more than the batches a worker has in flight plus those the trainer holds).
    """

    def __init__(self, layout: BatchLayout, capacity: int, n_slots: int = 8, owner: str = "") -> None:
        self.layout = layout
        self.owner = owner
        self.capacity = capacity
        self.n_slots = n_slots
        self.offsets: dict[str, int] = {}
        off = 0
        for k, (shape, dt) in layout.items():
            self.offsets[k] = off
            off = _round_up(off + capacity * math.prod(shape) * torch.empty(0, dtype=dt).element_size())
        self.slot_bytes = max(off, _ALIGN)
        self.size = _HEADER + n_slots * self.slot_bytes
        self.fd = os.memfd_create("kline-store-ring", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self.mm = mmap.mmap(self.fd, self.size)
        self.flags = np.frombuffer(self.mm, dtype=np.uint8, count=n_slots)
        self.token = f"{os.getpid()}-{id(self)}-{time.monotonic_ns()}"
        self.sent = False
        self._next = 0

    @classmethod
    def create(cls, layout: BatchLayout, capacity: int, n_slots: int = 8, owner: str = "") -> WorkerRing | None:
        """A ring, or None where anonymous shared memory is not available (not Linux)."""
        if not hasattr(os, "memfd_create"):
            return None
        return cls(layout, capacity, n_slots, owner)

    def take(self, n: int) -> int | None:
        """A free slot for ``n`` samples, marked busy; None when none is free or ``n`` does not fit."""
        if n > self.capacity:
            return None
        for i in range(self.n_slots):
            k = (self._next + i) % self.n_slots
            if self.flags[k] == 0:
                self.flags[k] = 1
                self._next = k + 1
                return k
        return None

    def tensors(self, slot: int, n: int) -> dict[str, torch.Tensor]:
        """Views of slot ``slot`` for ``n`` samples, to gather into."""
        base = _HEADER + slot * self.slot_bytes
        out = {}
        for k, (shape, dt) in self.layout.items():
            arr = np.ndarray((n, *shape), dtype=numpy_dtype(dt), buffer=self.mm, offset=base + self.offsets[k])
            out[k] = torch.from_numpy(arr)
        return out

    def handoff(self, slot: int, n: int) -> RingBatch:
        """The picklable stand-in for the batch in ``slot``: it unpickles as the batch dict."""
        return RingBatch(self, slot, n)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


class RingBatch:
    """A batch in a worker's ring slot; pickles as a few numbers and unpickles as a dict of tensors (views)."""

    def __init__(self, ring: WorkerRing, slot: int, n: int) -> None:
        self.ring, self.slot, self.n = ring, slot, n

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        r = self.ring
        fd = None if r.sent else DupFd(r.fd)   # the descriptor crosses once, with the worker's first batch
        r.sent = True
        entries = [(k, r.offsets[k], numpy_dtype(dt).str, shape) for k, (shape, dt) in r.layout.items()]
        return _rebuild, (r.token, fd, r.size, r.n_slots, r.slot_bytes, self.slot, self.n, entries, r.owner)


# token -> (mapping, slot flags, owner): the rings the training process has mapped, until their owner releases them
_attached: dict[str, tuple[mmap.mmap, np.ndarray, str]] = {}
_attach_lock = threading.Lock()


def _attach(token: str, fd: Any, size: int, n_slots: int, owner: str) -> tuple[mmap.mmap, np.ndarray]:
    with _attach_lock:
        ring = _attached.get(token)
        if ring is None:
            if fd is None:
                raise RuntimeError(f"kline-store: batch from ring {token} arrived after its loader released it")
            raw = fd.detach()
            try:
                mm = mmap.mmap(raw, size)
            finally:
                os.close(raw)
            ring = (mm, np.frombuffer(mm, dtype=np.uint8, count=n_slots), owner)
            _attached[token] = ring
        return ring[0], ring[1]


def release(owner: str) -> int:
    """Drop the training process's mappings of ``owner``'s rings (its workers have ended); returns how many.

    A mapping that batches still view stays mapped until the last of them is freed, then it is unmapped."""
    with _attach_lock:
        gone = [t for t, (_, _, o) in _attached.items() if o == owner]
        rings = [_attached.pop(t) for t in gone]
    for mm, flags, _ in rings:
        del flags
        try:
            mm.close()          # unmapped now when no batch views it
        except BufferError:
            pass                # views remain: unmapped with the last of them
    return len(rings)


def attached() -> int:
    """Rings the training process has mapped now (for tests and diagnostics)."""
    return len(_attached)


def _release(flags: np.ndarray, slot: int) -> None:
    flags[slot] = 0


def _rebuild(token: str, fd: Any, size: int, n_slots: int, slot_bytes: int, slot: int, n: int,
             entries: list[tuple[str, int, str, tuple[int, ...]]], owner: str = "") -> dict[str, torch.Tensor]:
    """Training-process side: the batch as tensors viewing the slot; the slot is freed with its last view."""
    mm, flags = _attach(token, fd, size, n_slots, owner)
    whole = np.frombuffer(mm, dtype=np.uint8, count=slot_bytes, offset=_HEADER + slot * slot_bytes)
    weakref.finalize(whole, _release, flags, slot)   # every view below keeps `whole` alive
    out = {}
    for key, off, dtype, shape in entries:
        dt = np.dtype(dtype)
        nbytes = n * math.prod(shape) * dt.itemsize
        out[key] = torch.from_numpy(whole[off: off + nbytes].view(dt).reshape(n, *shape))
    return out
