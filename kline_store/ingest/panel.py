"""Bars -> a panel [symbol, date, field], built a block of whole symbol rows at a time.

A block holds every day and field of a bounded number of rows (64 MiB at most, whatever the panel's size),
starts as NaN ("no bar") and receives the bars of its rows; the caller applies the factor policy to it
(adjust.py, row by row) and hands it to the writer. So no panel is ever held whole in memory and no file is
written through a mapping.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .bars import Bars

BLOCK_BYTES = 64 << 20


def block_rows(n_dates: int, n_fields: int, budget: int = BLOCK_BYTES) -> int:
    """Rows per block so that a block stays within ``budget`` bytes (at least one row)."""
    return max(1, budget // max(n_dates * n_fields * 4, 1))


@dataclass
class BarPlacement:
    """Where each bar goes: its row and calendar index, and the bars grouped by row.

    The bars of row ``r`` are ``order[bounds[r]:bounds[r + 1]]``, or simply ``bounds[r]:bounds[r + 1]`` when
    the bars come grouped by row in row order already (the usual input; no index array is then held).
    """

    row: np.ndarray
    pos: np.ndarray
    order: np.ndarray | None
    bounds: np.ndarray

    @classmethod
    def of(cls, row: np.ndarray, pos: np.ndarray, n_rows: int) -> "BarPlacement":
        order = None if len(row) < 2 or bool((row[1:] >= row[:-1]).all()) else np.argsort(row, kind="stable")
        bounds = np.searchsorted(row if order is None else row[order], np.arange(n_rows + 1), side="left")
        return cls(row, pos, order, bounds)

    def between(self, lo: int, hi: int) -> slice | np.ndarray:
        """The bars of rows lo..hi-1: a slice of the bars, or their indices."""
        a, b = int(self.bounds[lo]), int(self.bounds[hi])
        return slice(a, b) if self.order is None else self.order[a:b]


def scatter(block: np.ndarray, lo: int, bars: Bars, place: BarPlacement, fields: list[str], day0: int = 0,
            keep_stored: bool = False) -> None:
    """Write the bars of rows ``lo .. lo + len(block)`` into ``block`` [rows, days, fields], in place.

    Args:
        block: whole rows from ``lo``, days from calendar index ``day0`` (the bars placed lie in that range).
        fields: the block's fields; those the bars lack are left as they are.
        keep_stored: a missing input value leaves the cell as it is (a revision never erases a stored value).
    """
    sel = place.between(lo, lo + block.shape[0])
    r, p = place.row[sel] - lo, place.pos[sel] - day0
    if not len(r):
        return
    put(block, r, p, np.asarray(bars.values[sel]), bars.fields, fields, keep_stored)
    release(bars.values)


def put(block: np.ndarray, r: np.ndarray, p: np.ndarray, values: np.ndarray, given_fields: list[str],
        fields: list[str], keep_stored: bool = False) -> None:
    """Cells ``block[r, p]`` from ``values`` [bars, given_fields]: the block's ``fields`` the bars have (with
    ``keep_stored``, only where the bar has a value)."""
    nf = block.shape[2]
    if not keep_stored and given_fields == fields:
        if block.flags.c_contiguous:   # the common case: whole cells as one record each, one flat index
            cell = np.dtype((np.void, 4 * nf))
            np.put(block.view(cell).reshape(-1), r.astype(np.int64) * block.shape[1] + p,
                   np.ascontiguousarray(values, dtype=np.float32).view(cell).reshape(-1))
        else:
            block[r, p] = values
        return
    src = np.asarray([given_fields.index(f) for f in fields if f in given_fields], dtype=np.intp)
    dst = np.asarray([j for j, f in enumerate(fields) if f in given_fields], dtype=np.intp)
    cells = block[r, p] if (keep_stored or len(dst) < nf) else np.empty((len(r), nf), np.float32)
    given = values[:, src]
    cells[:, dst] = np.where(np.isfinite(given), given, cells[:, dst]) if keep_stored else given
    block[r, p] = cells


def new_blocks(bars: Bars, place: BarPlacement, n_rows: int, n_dates: int, fields: list[str]
               ) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, block) of a new panel from bars alone: NaN where no bar, fields the input lacks NaN."""
    step = block_rows(n_dates, len(fields))
    for lo in range(0, n_rows, step):
        block = np.full((min(step, n_rows - lo), n_dates, len(fields)), np.nan, dtype=np.float32)
        scatter(block, lo, bars, place, fields)
        yield lo, block


def release(arr: np.ndarray) -> None:
    """Drop the resident pages of a memory-mapped (spill) array, so reading a big input stays bounded in
    memory; a no-op for arrays in memory. The mapping is read-only: nothing is written back."""
    base = arr
    while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):
        base = base.base
    mm = getattr(base, "_mmap", None) if isinstance(base, np.memmap) else None
    if mm is not None:
        mm.madvise(mmap.MADV_DONTNEED)
