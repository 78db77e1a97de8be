"""Pages of mapped files: advice to the kernel (``madvise``, looked up in libc once) and the background read-ahead
of a store's pages.

``readahead``: the first epoch after opening a store would take a page fault for every page it touches (a disk
read each when the file is not cached). When the mapping fits in memory, the kernel is asked to read it ahead and a
background thread maps every page (``MADV_POPULATE_READ``): shared page-cache pages, never a private copy.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any

import numpy as np

from ..memory import mem_available
from .background import stopping, track

# Read ahead and map a store's pages when it takes at most this share of the available memory.
READAHEAD_FRACTION = 0.5

MADV_RANDOM = 1
MADV_WILLNEED = 3
MADV_DONTNEED = 4
MADV_POPULATE_READ = 22   # Linux 5.14+; older kernels answer EINVAL and the pages are touched instead
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_libc_madvise: Any = False   # libc's madvise, looked up once (a CDLL per call cost more than the call: the block
                             # order advises hundreds of ranges a second)


def madvise(addr: int, length: int, advice: int) -> bool:
    """``madvise(2)`` on ``[addr, addr + length)``; False where it failed or there is no libc madvise."""
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
    if total == 0 or total > (mem_available() if available is None else available) * READAHEAD_FRACTION:
        return None
    base = arr.ctypes.data
    first = base + np.asarray(starts, dtype=np.int64)
    aligned = first - first % PAGE
    sizes = length + (first - aligned)

    def populate(keep: np.ndarray = arr) -> None:  # holds the array: the mapping cannot go away meanwhile
        pages = list(zip(aligned.tolist(), sizes.tolist()))
        for start, size in pages:
            madvise(start, size, MADV_WILLNEED)
        flat = keep.reshape(-1).view(np.uint8)
        for start, size in pages:
            if stopping.is_set():   # the interpreter is exiting: stop between rows
                return
            if not madvise(start, size, MADV_POPULATE_READ):   # an older kernel: touch a byte per page
                lo = start - base
                int(flat[max(lo, 0): lo + size: PAGE].sum())

    th = track(threading.Thread(target=populate, name="kline-readahead", daemon=True))
    th.start()
    return th


__all__ = ["MADV_DONTNEED", "MADV_POPULATE_READ", "MADV_RANDOM", "MADV_WILLNEED", "PAGE", "READAHEAD_FRACTION",
           "madvise", "readahead"]
