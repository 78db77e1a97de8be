"""Where each bar of a full ingest goes in the new panel, worked out a chunk of bars at a time.

A bar's row is its symbol's (symbols sorted), its date index the place of its stamp in the calendar
(timeaxis.KeyIndex). One pass over the bars checks that every stamp is in the calendar, marks the cells that
have a bar (a duplicated symbol and date shows as fewer cells than bars) and tells whether the bars come grouped
by row in row order, as nearly every input does; then each block of rows is filled from its bars: a slice of
them when grouped, else through the bars' order by row (an index array, the one temporary that grows with the
input). Nothing else holds more than a chunk of bars.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..store import timeaxis
from .bars import Bars, calendar_positions
from .panel import put, release
from .sink import drop_pages

STEP = 1 << 16   # bars at a time: temporaries that stay in the cache


@dataclass
class PanelLayout:
    """Rows and calendar of a new panel, and the bars of each row (see :meth:`of`)."""

    rows_of: np.ndarray          # symbol code -> row
    index: timeaxis.KeyIndex           # calendar key -> date index
    per_key: int                 # minutes per key: 1440 on a daily axis, 1 on an intraday one
    present: np.ndarray          # [rows, dates] a bar there
    bounds: np.ndarray           # the bars of row r: bounds[r]:bounds[r + 1], in ``order`` when that is set
    order: np.ndarray | None

    @classmethod
    def of(cls, bars: Bars, calendar: np.ndarray, unit: str, rows_of: np.ndarray) -> "PanelLayout":
        """The layout of ``bars``; InputError for a bar outside the calendar or a duplicated bar."""
        n_rows = int(rows_of.max()) + 1 if len(rows_of) else 0
        out = cls(rows_of, timeaxis.KeyIndex(calendar), timeaxis.MINUTES_PER_DAY if unit == "D" else 1,
                  np.zeros((n_rows, len(calendar)), dtype=bool), np.zeros(0, np.int64), None)
        counts = np.zeros(n_rows, dtype=np.int64)
        grouped, last = True, -1
        n = len(bars)
        for lo in range(0, n, STEP):
            row, pos = out.place(bars, slice(lo, min(lo + STEP, n)))
            if (pos < 0).any():      # names the bars outside the calendar (from every bar: an error path)
                calendar_positions(bars.keys(unit), calendar, bars, unit)
            out.present[row, pos] = True
            counts += np.bincount(row, minlength=n_rows)
            if grouped and len(row):
                grouped = bool(row[0] >= last and (row[1:] >= row[:-1]).all())
                last = int(row[-1])
        if int(np.count_nonzero(out.present)) != n:    # names a duplicated bar (from every bar: an error path)
            sym = rows_of[np.asarray(bars.sym)]
            bars.present_mask(sym, out.index.find(bars.keys(unit)), out.present.shape)
        out.bounds = np.concatenate([[0], np.cumsum(counts)])
        if not grouped:
            out.order = np.argsort(rows_of[np.asarray(bars.sym)], kind="stable")
        return out

    def place(self, bars: Bars, sel: slice | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, date index) of the bars ``sel``; the date index is -1 for a stamp not in the calendar."""
        row = self.rows_of[np.asarray(bars.sym[sel])]
        keys = np.array(bars.minute[sel], dtype=np.int64)
        if isinstance(sel, slice):          # spilled columns: this chunk's pages go once read
            drop_pages(bars.sym, sel.start, sel.stop)
            drop_pages(bars.minute, sel.start, sel.stop)
        return row, self.index.find(keys // self.per_key if self.per_key > 1 else keys)

    def fill(self, block: np.ndarray, lo: int, bars: Bars, fields: list[str]) -> None:
        """Rows ``lo .. lo + len(block)`` of a new panel, in ``block`` (NaN where no bar), from their bars."""
        a, b = int(self.bounds[lo]), int(self.bounds[lo + len(block)])
        for c in range(a, b, STEP):
            sel = slice(c, min(c + STEP, b)) if self.order is None else self.order[c: min(c + STEP, b)]
            row, pos = self.place(bars, sel)
            put(block, row - lo, pos, np.asarray(bars.values[sel]), bars.fields, fields)
            if self.order is None:
                drop_pages(bars.values, sel.start, sel.stop)
        release(bars.values)
