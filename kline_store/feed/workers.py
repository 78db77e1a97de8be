"""Worker processes for the loader's ``backend="processes"``: for a per-batch Python transform that needs them.

The order is fixed in the training process and handed to the workers as chunks of sample positions (a
``DataLoader`` over :class:`ChunkFetch` serves as the process pool: fork or spawn, persistent workers,
``worker_init_fn``, ``timeout`` as users know them). Each worker gathers a chunk into a slot of its shared
ring (``shm.py``), so only a few numbers cross the process boundary per chunk; with a ``collate_fn`` it returns the
chunk's batches transformed, pickled as usual.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from .batches import slices
from .source import BatchLayout
from . import shm
from .shm import WorkerRing

Chunk = tuple[np.ndarray, list[int]]


def _identity(item: Any) -> Any:
    return item


class ChunkFetch(torch.utils.data.Dataset):
    """Map-style view whose item is a chunk: ``fetch[(positions, sizes)]`` gathers all of it at once.

    Args:
        source: the dataset (pickled into spawn workers as its path and parameters).
        layout: sample layout when samples have one shape (a ring slot is gathered into), else None.
        capacity: samples per ring slot.
        n_slots: ring slots per worker.
        collate_fn: applied to each batch of the chunk in the worker (then the batches travel pickled).
    """

    def __init__(self, source: Any, layout: BatchLayout | None, capacity: int, n_slots: int,
                 collate_fn: Callable[[Any], Any] | None) -> None:
        self.source, self.layout, self.capacity, self.n_slots = source, layout, capacity, n_slots
        self.collate_fn = collate_fn
        self.owner = f"{os.getpid()}-{id(self)}-{time.monotonic_ns()}"   # the training process's name for its rings
        self._ring: WorkerRing | None = None
        self._ring_made = False

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_ring", "_ring_made")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._ring, self._ring_made = None, False

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, item: Chunk) -> Any:
        idx, sizes = item
        if self.collate_fn is not None:
            chunk = self.source.gather_batch(idx)
            return [self.collate_fn(b) for b, _ in slices(chunk, sizes)]
        ring = self._worker_ring()
        slot = ring.take(len(idx)) if ring is not None else None
        if slot is None:
            return self.source.gather_batch(idx)
        try:
            self.source.gather_batch(idx, out=ring.tensors(slot, len(idx)))
        except BaseException:
            ring.flags[slot] = 0
            raise
        return ring.handoff(slot, len(idx))

    def _worker_ring(self) -> WorkerRing | None:
        if not self._ring_made:
            self._ring_made = True
            if self.layout is not None and torch.utils.data.get_worker_info() is not None:
                self._ring = WorkerRing.create(self.layout, self.capacity, self.n_slots, self.owner)
        return self._ring


class _PassSampler:
    """The chunks of the current pass; replaced before each pass, so persistent workers serve every epoch."""

    def __init__(self) -> None:
        self.items: list[Chunk] = []

    def __iter__(self) -> Iterator[Chunk]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


class ProcessPool:
    """Worker processes that gather chunks in the order given.

    Args:
        fetch: the chunk fetcher (pickled into each worker).
        num_workers: processes.
        prefetch: chunks in flight per worker.
        persistent: keep the workers between passes (the default: they reopen the store and rebuild the index).
        **options: ``DataLoader`` options passed as given (multiprocessing_context, worker_init_fn, timeout).
    """

    def __init__(self, fetch: ChunkFetch, num_workers: int, prefetch: int, persistent: bool = True,
                 **options: Any) -> None:
        self._sampler = _PassSampler()
        self.persistent, self._owner = persistent, fetch.owner
        # The training process's mappings of the workers' rings go with the pool, closed or collected.
        self._release = weakref.finalize(self, shm.release, fetch.owner)
        self.loader = DataLoader(fetch, batch_size=None, sampler=self._sampler, collate_fn=_identity,
                                 num_workers=num_workers, prefetch_factor=prefetch, persistent_workers=persistent,
                                 **options)
        self._it: Iterator[Any] | None = None

    def run(self, chunks: list[Chunk]) -> Iterator[tuple[Any, list[int], bool]]:
        """Gather ``chunks`` in order; yields ``(data, sizes, ready)``: a chunk to cut into batches, or (``ready``)
        the chunk's batches already transformed by the collate function."""
        self._sampler.items = chunks
        self._it = iter(self.loader)
        try:
            for (_, sizes), data in zip(chunks, self._it):
                yield data, sizes, isinstance(data, list)
        finally:
            if not self.persistent:   # this pass's workers end with it, and so do their rings
                it, self._it = self._it, None
                del it
                shm.release(self._owner)

    def close(self) -> None:
        """Stop the workers (persistent ones would otherwise linger until garbage collection)."""
        it, self._it = self._it, None
        if it is not None:
            del it
        self.loader = None  # type: ignore[assignment]
        self._release()
