"""Advice over byte ranges of a store's data file, for the block orders: read a block ahead in large requests
(``MADV_WILLNEED``, then ``MADV_POPULATE_READ``: mapped, so no 4 KiB fault when it is gathered), drop it behind
(``MADV_DONTNEED`` + ``POSIX_FADV_DONTNEED``), and mark mappings ``MADV_RANDOM`` (a fault reads its page, not
the device's read-around). Advice only: a failure costs speed, never a wrong sample.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..system.pages import MADV_DONTNEED as _MADV_DONTNEED, MADV_POPULATE_READ as _MADV_POPULATE_READ
from ..system.pages import MADV_RANDOM as _MADV_RANDOM, MADV_WILLNEED as _MADV_WILLNEED, PAGE as _PAGE
from ..system.pages import madvise as _madvise
ROOM_PROBES = 64   # rows whose reserved room is looked up in the page cache (mincore) after a pass


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


def advise_drop(maps: list[np.ndarray], store: Any, ranges: Iterable[tuple[int, int]]) -> None:
    """Drop the whole pages inside byte ranges of the data file from each mapping and (through ``store``'s
    ``advise_file``, when there is a store) from the page cache."""
    whole = []
    for lo, hi in ranges:
        lo = -(-lo // _PAGE) * _PAGE
        hi -= hi % _PAGE
        if hi <= lo:
            continue
        for m in maps:
            if m.ctypes.data % _PAGE == 0:
                _madvise(m.ctypes.data + lo, hi - lo, _MADV_DONTNEED)
        whole.append((lo, hi - lo))
    if store is not None and whole:
        store.advise_file(whole, "dontneed")


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

    def drop(self, store: Any, ranges: Iterable[tuple[int, int]]) -> None:
        advise_drop(self.gather + ([self.shared] if self.shared is not None else []), store, ranges)


def mapping_base(panel: np.ndarray) -> np.ndarray | None:
    """The array at the start of the mapping a strided panel view is cut from (None for an empty panel)."""
    a = panel
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a if a.size and a.ctypes.data % _PAGE == 0 else None


def _row_ranges(store: Any, room: bool) -> list[tuple[int, int]]:
    """``(offset, length)`` in the data file of each symbol row's stored days, or (``room``) of the room after them
    that the row reserves for future days (from the page after its last stored byte)."""
    stride, used = store.row_stride * 4, store.n_dates * store.n_fields * 4
    starts = np.arange(store.n_symbols, dtype=np.int64) * stride
    if not room:
        return [(int(a), used) for a in starts]
    lo = -(-(starts + used) // _PAGE) * _PAGE
    return [(int(a), int(b - a)) for a, b in zip(lo, starts + stride) if b > a]


def read_rows(store: Any, budget: int) -> None:
    """Ask the kernel to read every row's stored days ahead (at most ``budget`` bytes), before a pass over the panel
    reads them: the pass then finds them in the page cache, and the read-around of its page faults (128 KiB and
    more) never pulls in the zeros of the rows' reserved room, which would take as much page cache again."""
    if store.logical_bytes > budget:
        return
    store.advise_file(_row_ranges(store, room=False), "willneed")


def release_rows(store: Any) -> None:
    """After a pass over the panel through the store's own mapping: unmap its pages from this process (they stay
    in the page cache, where the gathers' mapping finds them: mapped twice they counted twice in the process's
    memory). When the rows' reserved room is in the page cache too (zeros a sequential read pulled in with the
    stored days, as a verify of a fresh store does), the rows are dropped and their stored days read again alone:
    a gather mapping maps whole folios, and folios holding both would map the room as well (twice the panel)."""
    base = mapping_base(store.panel)
    if base is None:
        return
    _madvise(base.ctypes.data, base.nbytes - base.nbytes % _PAGE, _MADV_DONTNEED)
    room = _row_ranges(store, room=True)
    if not room or not _any_resident(base, room[:: max(1, len(room) // ROOM_PROBES)]):
        return
    # in one call: a folio across two rows is inside no single row's range (pages others map stay)
    store.advise_file([(0, store.n_symbols * store.row_stride * 4)], "dontneed")
    store.advise_file(_row_ranges(store, room=False), "willneed")


_libc_mincore: Any = False   # looked up once


def _any_resident(base: np.ndarray, ranges: list[tuple[int, int]]) -> bool:
    """Whether any page of these byte ranges of the mapping ``base`` is in the page cache (``mincore``)."""
    global _libc_mincore
    if _libc_mincore is False:
        try:
            import ctypes
            fn = ctypes.CDLL(None, use_errno=True).mincore
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            _libc_mincore = fn
        except (OSError, AttributeError):
            _libc_mincore = None
    if _libc_mincore is None:
        return False
    for off, length in ranges:
        length = min(length, base.nbytes - off)
        if length <= 0:
            continue
        vec = np.zeros(-(-length // _PAGE), dtype=np.uint8)
        if _libc_mincore(base.ctypes.data + off, length, vec.ctypes.data) == 0 and (vec & 1).any():
            return True
    return False


def drop_rows(store: Any, a: int, b: int) -> None:
    """Drop symbol rows ``[a, b)`` of ``store`` from this process's mapping and from the page cache."""
    base = mapping_base(store.panel)
    lo, hi = a * store.row_stride * 4, b * store.row_stride * 4
    hi = min(hi, base.nbytes) if base is not None else hi
    advise_drop([base] if base is not None else [], store, [(lo, hi)])


__all__ = ["Mappings", "advise_drop", "advise_read", "drop_rows", "mapping_base", "mark_random", "read_rows",
           "release_rows"]
