"""Advice over byte ranges of a store's data file, for the block orders: read a block ahead in large requests
(``MADV_WILLNEED``, then ``MADV_POPULATE_READ``: mapped, so no 4 KiB fault when it is gathered), drop it behind
(``MADV_DONTNEED`` + ``POSIX_FADV_DONTNEED``), and mark mappings ``MADV_RANDOM`` (a fault reads its page, not
the device's read-around). Advice only: a failure costs speed, never a wrong sample.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..feed.placement import _madvise

_MADV_DONTNEED = 4
_MADV_RANDOM = 1
_MADV_WILLNEED = 3
_MADV_POPULATE_READ = 22
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def mark_random(flat: np.ndarray) -> None:
    """``MADV_RANDOM`` over a mapping: a fault reads its page, not the device's read-around (blocks are read
    ahead exactly, by :func:`advise_read`)."""
    if flat.nbytes and flat.ctypes.data % _PAGE == 0:
        _madvise(flat.ctypes.data, flat.nbytes, _MADV_RANDOM)


def advise_read(maps: list[np.ndarray], ranges: Iterable[tuple[int, int]]) -> None:
    """Read byte ranges of the data file ahead and map them in each of ``maps`` (the mappings gathers read):
    ``MADV_WILLNEED`` over every range first (large reads queued at once; once, through the first mapping: the page
    cache is the file's), then ``MADV_POPULATE_READ`` in each mapping (no 4 KiB fault when they are gathered)."""
    ranges = [(lo, hi) for lo, hi in ranges if hi > lo]
    for advice, where in ((_MADV_WILLNEED, maps[:1]), (_MADV_POPULATE_READ, maps)):
        for m in where:
            for lo, hi in ranges:
                start = m.ctypes.data + lo
                aligned = start - start % _PAGE
                _madvise(aligned, hi - lo + (start - aligned), advice)


def advise_drop(maps: list[np.ndarray], fd: int | None, ranges: Iterable[tuple[int, int]]) -> None:
    """Drop the whole pages inside byte ranges of the data file from each mapping and from the page cache."""
    for lo, hi in ranges:
        lo = -(-lo // _PAGE) * _PAGE
        hi -= hi % _PAGE
        if hi <= lo:
            continue
        for m in maps:
            if m.ctypes.data % _PAGE == 0:
                _madvise(m.ctypes.data + lo, hi - lo, _MADV_DONTNEED)
        if fd is not None:
            try:
                os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
            except (OSError, AttributeError):
                pass


class Mappings:
    """The mappings of a store's data file whose pages a block index advises: the gathers' own (read ahead, mapped,
    dropped with blocks) and the store's shared one (what segments are computed from: dropped with blocks, read
    ahead only while no gather mapping is known; populating it too would map every block twice)."""

    def __init__(self) -> None:
        self.gather: list[np.ndarray] = []
        self.shared: np.ndarray | None = None

    def add(self, flat: np.ndarray | None) -> None:
        """A gather's mapping (each once), marked ``MADV_RANDOM``: a fault reads its page, not the read-around."""
        if flat is not None and not any(m is flat for m in self.gather):
            self.gather.append(flat)
            mark_random(flat)

    def set_shared(self, base: np.ndarray | None) -> None:
        if base is not None:
            self.shared = base
            mark_random(base)

    def read(self, ranges: Iterable[tuple[int, int]]) -> None:
        advise_read(self.gather or ([self.shared] if self.shared is not None else []), ranges)

    def drop(self, fd: int | None, ranges: Iterable[tuple[int, int]]) -> None:
        advise_drop(self.gather + ([self.shared] if self.shared is not None else []), fd, ranges)


def mapping_base(panel: np.ndarray) -> np.ndarray | None:
    """The array at the start of the mapping a strided panel view is cut from (None for an empty panel)."""
    a = panel
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a if a.size and a.ctypes.data % _PAGE == 0 else None


def drop_rows(store: Any, a: int, b: int) -> None:
    """Drop symbol rows ``[a, b)`` of ``store`` from this process's mapping and from the page cache."""
    base = mapping_base(store.panel)
    lo, hi = a * store.row_stride * 4, b * store.row_stride * 4
    hi = min(hi, base.nbytes) if base is not None else hi
    advise_drop([base] if base is not None else [], getattr(store, "_fd", None), [(lo, hi)])


__all__ = ["Mappings", "advise_drop", "advise_read", "drop_rows", "mapping_base", "mark_random"]
