"""The loader's host stage: chunks gathered into host memory, in order, by the training thread (on demand, in
a helper kept off OpenMP), by threads that release the GIL, or by worker processes through a shared-memory ring;
into reused buffers (recycled CPU buffers, or pinned ring slots when a GPU copies from them).

Each stage yields ``(data, sizes, slot)``: a chunk and its batch sizes with the ring slot it occupies (None when
it has none), or a list of batches already transformed by ``collate_fn`` with ``slot == "ready"``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from .batches import map_tensors, slices
from .source import BatchLayout
from .buffers import HostRing, Recycler, numpy_dtype, pinned_alloc, trim_heap
from .chunks import Chunk
from .prefetch import KeepTorchThreads, OrderedPrefetcher, SingleThreaded, single_threaded_torch
from .workers import ChunkFetch, ProcessPool

Batch = dict[str, torch.Tensor]
HostOut = tuple[Any, list[int], Any]

# A chunk is cut into one part per gather thread, but never into parts smaller than this: each part pays a fixed
# cost under the GIL (index arithmetic, a dozen small kernels' dispatch), and with many threads over small parts
# that serial cost outgrew the parallel copy (on a 16-core host, 8 threads gathered 0.4x what 2 did).
MIN_PART_BYTES = 2 << 20


def parts_per_chunk(n_threads: int, chunk_bytes: int) -> int:
    """How many parts, gathered side by side by different threads, one chunk of ``chunk_bytes`` is cut into."""
    return max(1, min(n_threads, chunk_bytes // MIN_PART_BYTES))


def layout_nbytes(layout: BatchLayout) -> int:
    """Bytes of one sample of ``layout``."""
    return sum(int(np.prod(shape, dtype=np.int64)) * numpy_dtype(dt).itemsize for shape, dt in layout.values())


class ChunkBuffer:
    """The buffer one chunk is gathered into, taken by whichever of its parts runs first.

    Parts finish in any order across threads; the loader delivers the chunk with the part that completes it.
    """

    def __init__(self, n: int, parts: int, recycler: Recycler | None, ring: HostRing | None) -> None:
        self.n, self.expected, self.recycler, self.ring = n, parts, recycler, ring
        self.out: Batch | None = None
        self.slot: tuple[HostRing, int] | None = None
        self.done = 0
        self._lock = threading.Lock()

    def get(self) -> Batch | None:
        with self._lock:
            if self.out is None:
                if self.recycler is not None:
                    self.out = self.recycler.take(self.n)
                elif self.ring is not None:
                    k = self.ring.acquire()
                    self.slot = (self.ring, k)
                    self.out = {key: t[: self.n] for key, t in self.ring.buffers[k].items()}
            return self.out

    def part_done(self) -> bool:
        """Count a finished part; True for the one that completes the chunk."""
        with self._lock:
            self.done += 1
            return self.done == self.expected

    def release(self) -> None:
        if self.slot is not None:
            self.slot[0].release(self.slot[1])


class HostStage:
    """The buffers, threads and worker processes a loader keeps between passes.

    Args:
        source: the dataset (a BatchSource) worker processes gather from.
        layout: shape and dtype per key of one sample, or None (one batch per gather, no reusable buffers).
        capacity: samples per chunk buffer.
        config: the loader's resolved configuration (``prefetch``).
        collate_fn: a per-batch transform run where batches are gathered, or None.
        device: where batches go (a CUDA device synchronises before pinned buffers are reused).
        worker_options, persistent: DataLoader-style options for worker processes.
    """

    def __init__(self, source: Any, layout: BatchLayout | None, capacity: int, config: dict[str, Any],
                 collate_fn: Callable[[Any], Any] | None, device: torch.device, worker_options: dict[str, Any],
                 persistent: bool | None) -> None:
        self.source, self.layout, self.capacity, self.config = source, layout, capacity, config
        self.collate_fn, self.device = collate_fn, device
        self._worker_options, self._persistent = worker_options, persistent
        self._recycler: Recycler | None = None
        self._ring: HostRing | None = None
        self._ring_key: tuple[int, int] | None = None
        self._passes = 0
        self._pool: ProcessPool | None = None
        self._sync: SingleThreaded | None = None

    def threads(self, chunks: Iterator[Chunk], gather: Callable[..., Batch], n_threads: int, pin: bool) -> Iterator[HostOut]:
        """Gather ``chunks`` with ``gather`` in ``n_threads`` threads (0: on demand, one chunk at a time)."""
        capacity = self.capacity
        depth = max(1, self.config["prefetch"]) * max(1, n_threads)
        fixed = self.layout is not None
        # Buffers: `depth` chunks being gathered or waiting, the one the consumer cuts, and one whose last batch
        # the training step may still hold (the recycler takes fresh memory beyond that, never a busy slot).
        ring = self._make_ring(depth + 2, capacity) if pin and fixed else None
        recycler = self._make_recycler(depth + 2, capacity) if fixed and not pin else None
        # A per-batch transform runs on the host batches, in the gather threads (the training thread without them).
        split = self.collate_fn
        # With several threads each chunk is cut into one part per thread, gathered side by side into the same
        # buffer: a chunk is ready when its parts are, and no thread waits behind a slower one's whole chunk.
        buffered = split is None and (recycler is not None or ring is not None)
        n_parts = parts_per_chunk(n_threads, capacity * layout_nbytes(self.layout)) if buffered and fixed else 1

        def items(source: Iterator[Chunk]) -> Iterator[tuple[Any, ...]]:
            for idx, sizes in source:   # runs in a gather thread, under the prefetcher's lock: never blocks
                n = len(idx)
                box = ChunkBuffer(n, n_parts, recycler, ring)
                if n_parts == 1:
                    yield idx, sizes, box, 0, n
                    continue
                cuts = [n * j // n_parts for j in range(n_parts + 1)]
                for a, b in itertools.pairwise(cuts):
                    yield idx, sizes, box, a, b

        def work(item: tuple[Any, ...]) -> tuple[Any, list[int], Any] | None:
            idx, sizes, box, a, b = item
            out = box.get()   # the first part to run takes the chunk's buffer (a ring slot may wait for its copy)
            if out is not None:
                try:
                    gather(idx[a:b], out=out if b - a == len(idx) else {k: v[a:b] for k, v in out.items()})
                except BaseException:
                    box.release()
                    raise
                if not box.part_done():
                    return None          # not the last part: the chunk is delivered with the last one
                data: Any = out
            else:
                data = gather(idx)
                if pin:
                    data = map_tensors(lambda t: t.pin_memory(), data)
            if split is not None:
                return [split(bt) for bt, _ in slices(data, sizes)], sizes, "ready"
            return data, sizes, box.slot   # a ring slot travels with its chunk to the copy stage

        if n_threads == 0:   # on demand, one chunk at a time, in a helper thread kept off OpenMP
            if self._sync is None:
                self._sync = SingleThreaded()
            try:
                for item in items(chunks):
                    yield self._sync.call(work, item)
            finally:   # also when the pass is abandoned (a `break`): the next pass reuses the ring
                if ring is not None:
                    self._passes -= 1
                trim_heap()
            return
        with KeepTorchThreads():  # the constructor returns once every thread has lowered its own count
            pf: OrderedPrefetcher[Any, Any] = OrderedPrefetcher(items(chunks), work, n_threads=n_threads,
                                                                depth=depth * n_parts,
                                                                thread_init=single_threaded_torch)
        try:
            for item in pf:   # not `yield from`: that would forward close() to pf, joining stuck producers
                if item is not None:
                    yield item
        finally:
            pf.close(join=False)
            if ring is not None:   # producers may wait for slots held by chunks nobody will consume
                for k in range(len(ring)):
                    ring.release(k)
            pf.join()
            if ring is not None:
                self._passes -= 1
            trim_heap()   # the gather threads' temporaries, freed into their arenas

    def processes(self, chunks: list[Chunk], n_workers: int) -> Iterator[HostOut]:
        """Gather ``chunks`` in ``n_workers`` worker processes (started on first use, kept while persistent)."""
        if self._pool is None:
            fetch = ChunkFetch(self.source, self.layout, self.capacity, self.config["prefetch"] + 4, self.collate_fn)
            self._pool = ProcessPool(fetch, n_workers, self.config["prefetch"],
                                     persistent=self._persistent is not False, **self._worker_options)
        for data, sizes, ready in self._pool.run(chunks):
            yield data, sizes, ("ready" if ready else None)

    def _make_recycler(self, slots: int, capacity: int) -> Recycler:
        if self._recycler is None or self._recycler.capacity != capacity:
            assert self.layout is not None
            self._recycler = Recycler(self.layout, capacity, slots)
        return self._recycler

    def _make_ring(self, n_slots: int, capacity: int) -> HostRing:
        """A ring for one pass. Each pass gets its own slot state (a pass that stopped early, `break`, keeps its
        slots held and may still release them late); the pinned buffers are reused when no other pass is running
        and no copy out of them can still be in flight."""
        assert self.layout is not None
        self._passes += 1
        if self._ring is not None and self._ring_key == (n_slots, capacity) and self._passes == 1:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)   # copies of an abandoned pass may still read them
            self._ring = HostRing(n_slots, lambda: None, buffers=self._ring.buffers)
        else:
            self._ring = HostRing(n_slots, pinned_alloc(self.layout, capacity))
            self._ring_key = (n_slots, capacity)
        return self._ring

    def close(self) -> None:
        """Stop worker processes and the on-demand gather thread (prefetch threads end with each pass)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        sync, self._sync = self._sync, None
        if sync is not None:
            sync.close()


__all__ = ["MIN_PART_BYTES", "ChunkBuffer", "HostOut", "HostStage", "layout_nbytes", "parts_per_chunk"]
