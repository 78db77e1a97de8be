"""Reusable host buffers for gathered chunks: recycled CPU buffers, and the pinned staging ring for GPU copies.

Fresh multi-megabyte tensors cost page faults on every chunk (they come from newly mapped memory), which can
double the price of a gather; both kinds of buffer here are allocated once and reused, and neither is ever
overwritten while something still reads it.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from .source import BatchLayout


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (float32, int64, bool, ...)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


class Recycler:
    """Host buffers for batches that stay on the CPU, reused once nothing handed out from them is alive.

    Each slot is a set of numpy arrays; the tensors handed out are ``torch.from_numpy`` views, which keep a
    reference to their array. A slot whose arrays are referenced by nothing but the recycler is free again, so
    batches a caller keeps (a list of them, a batch stored for later) are never overwritten: the recycler takes
    another slot instead.

    Args:
        layout: ``{key: (shape of one sample, torch dtype)}``.
        capacity: samples per slot.
        max_slots: slots kept for reuse; beyond them, buffers are fresh and not kept.
    """

    def __init__(self, layout: BatchLayout, capacity: int, max_slots: int) -> None:
        self.layout = {k: (shape, numpy_dtype(dt)) for k, (shape, dt) in layout.items()}
        self.capacity, self.max_slots = capacity, max_slots
        self.slots: list[dict[str, np.ndarray]] = []
        self._base: list[int] = []
        self._lock = threading.Lock()
        self.reused = 0

    def _alloc(self) -> dict[str, np.ndarray]:
        return {k: np.empty((self.capacity, *shape), dtype=dt) for k, (shape, dt) in self.layout.items()}

    def _refs(self, k: int) -> int:
        # Each array is referenced by its slot, by this loop, and once more while any tensor views it.
        return max(sys.getrefcount(a) for a in self.slots[k].values())

    def take(self, n: int) -> dict[str, torch.Tensor]:
        """Tensors for ``n <= capacity`` samples: views of a free slot, or fresh ones when none is free."""
        with self._lock:  # selecting a slot and creating its views must be atomic between producer threads
            for k in range(len(self.slots)):
                if self._refs(k) <= self._base[k]:
                    self.reused += 1
                    return {key: torch.from_numpy(a[:n]) for key, a in self.slots[k].items()}
            slot = self._alloc()
            if len(self.slots) < self.max_slots:
                self.slots.append(slot)
                self._base.append(self._refs(len(self.slots) - 1))  # before any view exists
            return {key: torch.from_numpy(a[:n]) for key, a in slot.items()}


class HostRing:
    """A fixed set of pinned host buffers reused round-robin; a buffer is handed out again only after the copy
    that reads it finished.

    The consumer releases a slot together with the event recorded after the copy that reads it; ``acquire``
    waits on that event (in the producer's thread, off the training loop) before the slot may be overwritten.

    Args:
        n_slots: number of buffers.
        alloc: makes one buffer (called ``n_slots`` times, eagerly).
        buffers: reuse another ring's buffers (pinned memory is costly to allocate), with fresh slot state.
    """

    def __init__(self, n_slots: int, alloc: Callable[[], Any], buffers: list[Any] | None = None) -> None:
        if n_slots < 1:
            raise InputError(f"HostRing needs at least one slot (got {n_slots})")
        self._free: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self.buffers = buffers if buffers is not None else [alloc() for _ in range(n_slots)]
        for k in range(len(self.buffers)):
            self._free.put((k, None))
        self.acquired: list[int] = []  # slot order, for tests and diagnostics (bounded below)

    def __len__(self) -> int:
        return len(self.buffers)

    def acquire(self, timeout: float | None = None) -> int:
        """Take a free slot (blocking), wait until the last copy out of it completed, return its number."""
        try:
            k, event = self._free.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("HostRing: no slot was released in time") from None
        if event is not None:
            event.synchronize()
        if len(self.acquired) < 4096:
            self.acquired.append(k)
        return k

    def release(self, k: int, event: Any = None) -> None:
        """Give slot ``k`` back; ``event`` (``synchronize()``-able) marks the end of the copy reading it."""
        self._free.put((k, event))


_malloc_trim: Any = False   # glibc's malloc_trim, looked up once (None elsewhere)


def trim_heap() -> None:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim``): the temporaries of a pass's gathers
    (index arithmetic, label reads) are freed into each gather thread's arena, which glibc keeps for reuse; without
    this a loader's process holds them after every pass, beyond its buffers. A no-op where there is no glibc."""
    global _malloc_trim
    if _malloc_trim is False:
        try:
            import ctypes
            _malloc_trim = ctypes.CDLL(None).malloc_trim
            _malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _malloc_trim = None
    if _malloc_trim is not None:
        _malloc_trim(0)


def pinned_alloc(layout: BatchLayout, capacity: int) -> Callable[[], dict[str, torch.Tensor]]:
    """A function that allocates one pinned buffer set for ``capacity`` samples of ``layout``."""
    def alloc() -> dict[str, torch.Tensor]:
        return {k: torch.empty((capacity, *shape), dtype=dt, pin_memory=True) for k, (shape, dt) in layout.items()}

    return alloc


def __getattr__(name: str):
    """``Layout``: the old name of :data:`~kline_store.feed.source.BatchLayout`, still importable from here."""
    if name == "Layout":
        import warnings
        warnings.warn("kline_store.feed.buffers.Layout is now kline_store.feed.source.BatchLayout", DeprecationWarning,
                      stacklevel=2)
        return BatchLayout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
