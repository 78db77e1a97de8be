"""Where the panel lives while batches are gathered, and how its pages get into memory.

* ``choose_placement``: on a GPU, a resident copy when it fits, else a pinned host copy, else the memmap; on the
  CPU always the memmap (the page cache holds it once for every process and rank on the machine; a private copy
  would multiply it by the number of ranks).
* ``readahead``: the first epoch after opening a store would take a page fault for every page it touches
  (a disk read each when the file is not cached). When the mapping fits in memory, the kernel is asked to read it
  ahead and a background thread maps every page (``MADV_POPULATE_READ``): shared page-cache pages, never a
  private copy.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any

import numpy as np
import torch

from .background import stopping, track
from ..memory import mem_available
from ..errors import InputError

PLACEMENTS = ("auto", "device", "pinned", "memmap")
# Fractions of free memory a panel may take: leave the device room for the model and activations.
DEVICE_FRACTION = 0.5
PINNED_FRACTION = 0.25
# Read ahead and map a store's pages when it takes at most this share of the available memory.
READAHEAD_FRACTION = 0.5

_MADV_WILLNEED = 3
_MADV_POPULATE_READ = 22   # Linux 5.14+; older kernels answer EINVAL and the pages are touched instead
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def choose_placement(nbytes: int, *, cuda: bool, requested: str = "auto", device_free: int | None = None,
                     host_available: int | None = None, device_fraction: float = DEVICE_FRACTION,
                     pinned_fraction: float = PINNED_FRACTION) -> str:
    """Where the panel (the fields and days samples use) should live.

    ``auto`` on CUDA picks ``device`` when the panel fits in ``device_fraction`` of the free device memory, else
    ``pinned`` when it fits in ``pinned_fraction`` of the available host memory, else ``memmap``. Without CUDA,
    ``auto`` is ``memmap``.

    Args:
        nbytes: bytes of the panel to place.
        cuda: whether batches go to a CUDA device.
        requested: "auto", or a placement to force.
        device_free: free device memory in bytes (None: unknown, treated as 0).
        host_available: available host memory in bytes (None: unknown, treated as 0).
        device_fraction: share of free device memory the panel may use.
        pinned_fraction: share of available host memory the pinned panel may use.

    Returns:
        "device", "pinned" or "memmap".

    Raises:
        InputError: unknown placement, or "pinned" without CUDA.
    """
    if requested not in PLACEMENTS:
        raise InputError(f"placement must be one of {', '.join(PLACEMENTS)}; got {requested!r}")
    if requested == "pinned" and not cuda:
        raise InputError("placement='pinned' needs a CUDA device (pinned memory only speeds up copies to a GPU); "
                         "use placement='memmap' or 'device' with device='cpu'")
    if requested != "auto":
        return requested
    if not cuda:
        return "memmap"
    if nbytes <= (device_free or 0) * device_fraction:
        return "device"
    if nbytes <= (host_available or 0) * pinned_fraction:
        return "pinned"
    return "memmap"


def host_available_bytes() -> int:
    """Available host memory (``MemAvailable``), or physical memory when /proc is not there."""
    return mem_available()


def device_free_bytes(device: Any) -> int | None:
    """Free memory of a CUDA device in bytes; None for the CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free)


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def background_priority() -> None:
    """Give the calling thread the lowest CPU priority (Linux: a thread is scheduled on its own; elsewhere a no-op).

    For work done ahead of need (the next epoch's order): it should take only cores nobody else wants.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


_libc_madvise: Any = False   # libc's madvise, looked up once (a CDLL per call cost more than the call: the block
                             # order advises hundreds of ranges a second)


def _madvise(addr: int, length: int, advice: int) -> bool:
    global _libc_madvise
    if _libc_madvise is False:
        _libc_madvise = None
        if sys.platform.startswith("linux"):
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _libc_madvise = fn
    if _libc_madvise is None:
        return False
    return _libc_madvise(addr, length, advice) == 0  # releases the GIL


def readahead(arr: np.ndarray, starts: np.ndarray | None = None, length: int = 0,
              available: int | None = None) -> threading.Thread | None:
    """Read a mapped array's pages ahead and map them in a background thread, when they fit in memory.

    Args:
        arr: a memory-mapped array (its pages are shared page cache; nothing is copied).
        starts: byte offsets of the parts of ``arr`` to read, each ``length`` bytes (default: all of ``arr``).
            A store's rows reserve room for future days: reading that room would fill the page cache with zeros.
        length: bytes per part.
        available: host memory available (default: measured).

    Returns:
        The background thread (joinable), or None when there is nothing to read or it does not fit.
    """
    if starts is None:
        starts, length = np.zeros(1, dtype=np.int64), int(arr.nbytes)
    total = len(starts) * length
    if total == 0 or total > (host_available_bytes() if available is None else available) * READAHEAD_FRACTION:
        return None
    base = arr.ctypes.data
    first = base + np.asarray(starts, dtype=np.int64)
    aligned = first - first % _PAGE
    sizes = length + (first - aligned)

    def populate(keep: np.ndarray = arr) -> None:  # holds the array: the mapping cannot go away meanwhile
        pages = list(zip(aligned.tolist(), sizes.tolist()))
        for start, size in pages:
            _madvise(start, size, _MADV_WILLNEED)
        flat = keep.reshape(-1).view(np.uint8)
        for start, size in pages:
            if stopping.is_set():   # the interpreter is exiting: stop between rows
                return
            if not _madvise(start, size, _MADV_POPULATE_READ):   # an older kernel: touch a byte per page
                lo = start - base
                int(flat[max(lo, 0): lo + size: _PAGE].sum())

    th = track(threading.Thread(target=populate, name="kline-readahead", daemon=True))
    th.start()
    return th
