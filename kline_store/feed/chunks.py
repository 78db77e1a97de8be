"""What each gather call takes: epoch orders computed ahead of need, and consecutive index batches grouped into
chunks of about CHUNK_BYTES, so the fixed cost of a gather call is paid once per chunk and batches are views of it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from ..system.background import track
from .source import BatchLayout
from ..system.cores import background_priority
from .sampling import EpochBatches

# Bytes gathered per host call (several batches): the fixed cost of a gather call (Python, index arithmetic, a
# dozen small kernels) is paid once per chunk instead of once per batch.
CHUNK_BYTES = 8 << 20
# On a GPU-resident panel a chunk is a few device kernels whose launch costs the same at any size: gathering 64 MiB
# at a time makes that cost a few microseconds per batch (at 8 MiB it was a third of an H200 training step's wait).
DEVICE_CHUNK_BYTES = 64 << 20

Chunk = tuple[np.ndarray, list[int]]


def batches_per_chunk(layout: BatchLayout | None, batch_size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Batches per chunk of about ``chunk_bytes`` for samples of ``layout``; 1 when each batch has its own shape
    (``layout`` None)."""
    if layout is None:
        return 1
    sample = sum(int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dt).element_size()
                 for shape, dt in layout.values())
    return max(1, chunk_bytes // max(1, sample * batch_size))


def chunk_plan(batches: Iterable[np.ndarray], per_chunk: int) -> Iterator[Chunk]:
    """Group consecutive index batches into chunks of up to ``per_chunk`` batches.

    The first chunks of a pass are small (1, 2, 4, ... batches) so the first batch arrives after one batch's
    gather, not a whole chunk's.
    """
    want = 1
    group: list[np.ndarray] = []
    for b in batches:
        group.append(b)
        if len(group) == want:
            yield (group[0] if want == 1 else np.concatenate(group)), [len(g) for g in group]
            group = []
            want = min(per_chunk, 2 * want)
    if group:
        yield np.concatenate(group), [len(g) for g in group]


class OrderAhead:
    """Epoch orders computed in a background thread before they are needed.

    Shuffling millions of windows takes a noticeable fraction of a second (numpy releases the GIL meanwhile): the
    first epoch's order is started when the loader is made, each next one when an epoch starts, at the lowest
    scheduling priority so that it takes only what the gathers leave.
    """

    def __init__(self, sampler: EpochBatches) -> None:
        self.sampler = sampler
        self._jobs: dict[int, tuple[threading.Thread, list[np.ndarray]]] = {}

    def start(self, epoch: int) -> None:
        if epoch in self._jobs or not self.sampler.shuffle:
            return
        for stale in [e for e in self._jobs if e < epoch - 1]:
            del self._jobs[stale]
        box: list[np.ndarray] = []

        def compute() -> None:
            background_priority()   # idle cores only: never slows the gathers of the epoch being delivered
            box.append(self.sampler.indices_for(epoch))

        th = track(threading.Thread(target=compute, name="kline-order", daemon=True))   # joined at exit
        th.start()
        self._jobs[epoch] = (th, box)

    def install(self, epoch: int) -> None:
        job = self._jobs.pop(epoch, None)
        if job is not None:
            job[0].join()
            if job[1]:
                self.sampler.provide(epoch, job[1][0])


__all__ = ["CHUNK_BYTES", "DEVICE_CHUNK_BYTES", "Chunk", "OrderAhead", "batches_per_chunk", "chunk_plan"]
