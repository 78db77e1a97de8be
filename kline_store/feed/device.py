"""Device feeding: host chunks copied to a GPU ahead of use, or batches gathered on a GPU-resident panel.

* ``cuda_stage``: each host chunk (in a pinned ring slot) is copied with ``non_blocking=True`` on a side stream,
  the next chunk's copy in flight while the current one is consumed; the training stream waits on the copy's
  event (GPU-side, the host never blocks), and the ring slot goes back to the producers with that event, so it
  is refilled only after the copy that reads it completed.
* ``resident_stream``: the panel lives on the device (``placement="device"``); the epoch's order is uploaded
  once and each chunk is a device slice plus the gather kernels: no host work per batch.
* ``to_device``: any iterable of CPU batches (a plain ``DataLoader``), copied one batch ahead.

The same code runs on the CPU for testing: a stage on ``device="cpu"`` is a pass-through.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .batches import batch_length, leaves, map_tensors, slices
from .buffers import HostRing

# A host stage yields (chunk, sizes, slot): the gathered tensors, the batch sizes to cut them into, and the ring
# slot they occupy (``(ring, k)``, or None when the chunk owns its memory).
Slot = tuple[HostRing, int] | None
HostItem = tuple[Any, list[int], Slot]


def cuda_stage(host: Iterable[HostItem], device: torch.device) -> Iterator[tuple[Any, int]]:
    """Copy host chunks to ``device`` on a side stream, one chunk ahead of the consumer; yield device batches."""
    side = torch.cuda.Stream(device)
    inflight: collections.deque[tuple[Any, list[int], Any]] = collections.deque()

    def issue(item: HostItem) -> None:
        chunk, sizes, slot = item
        with torch.cuda.stream(side):
            dev = map_tensors(lambda t: t.to(device, non_blocking=True, copy=True), chunk)
            event = torch.cuda.Event()
            event.record(side)
        if slot is not None:
            ring, k = slot
            ring.release(k, event)  # the producer waits on `event` before refilling the slot
        inflight.append((dev, sizes, event))

    source = iter(host)
    first = next(source, None)
    if first is not None:
        issue(first)
    while inflight:
        dev, sizes, event = inflight.popleft()
        nxt = next(source, None)  # keep the next chunk's copy in flight while this one is consumed
        if nxt is not None:
            issue(nxt)
        current = torch.cuda.current_stream(device)
        current.wait_event(event)  # GPU-side wait: the host does not block
        for t in leaves(dev):
            t.record_stream(current)  # memory allocated on `side`, used on `current`
        yield from slices(dev, sizes)


def resident_stream(gather: Callable[[torch.Tensor], Any], chunks: Sequence[tuple[np.ndarray, list[int]]],
                    device: torch.device) -> Iterator[tuple[Any, int]]:
    """Batches gathered on the device from a resident panel: the epoch's order uploaded once, then per chunk a
    device slice and the gather kernels."""
    if not chunks:
        return
    flat = torch.from_numpy(np.concatenate([idx for idx, _ in chunks]))
    if device.type == "cuda":
        flat = flat.pin_memory()
    flat = flat.to(device, non_blocking=True)  # one upload per epoch
    start = 0
    for idx, sizes in chunks:
        n = len(idx)
        yield from slices(gather(flat[start: start + n]), sizes)
        start += n


def to_device(batches: Iterable[Any], device: torch.device | str, pin: bool = True) -> Iterator[Any]:
    """Any iterable of CPU batches (tensors, tuples, dicts) delivered on ``device``, one copy ahead.

    On the CPU this is the iterable itself; on CUDA each batch is pinned (unless ``pin`` is False or it is
    already pinned) and copied on a side stream while the previous one is used.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        yield from batches
        return

    def host() -> Iterator[HostItem]:
        for b in batches:
            if pin:
                b = map_tensors(lambda t: t if not isinstance(t, torch.Tensor) or t.is_pinned() else t.pin_memory(),
                                b)
            yield b, [batch_length(b)], None

    for batch, _n in cuda_stage(host(), dev):
        yield batch
