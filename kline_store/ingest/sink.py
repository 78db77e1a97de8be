"""Where the bars of the inputs collect as they are read: flat columns, in memory or in spill files.

One entry per bar: its symbol code (in first-seen order), stamp in minutes, file, row, and values. Column files
(not records) so that a pass over one column touches only that column's pages. In memory, the columns are
allocated once for the expected number of bars (grown if the guess was short), so no chunk is copied twice. A
file that must be read again (readers.Reread) is rolled back to where its bars began.
"""

from __future__ import annotations

import errno
import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ..errors import InputError
from ..store import safefs, timeaxis
from .inputs import location

BLOCK = 1 << 16   # rows worked on at a time for the stamps (temporaries that stay in the cache)
COLUMNS = (("sym", np.uint32), ("minute", np.int64), ("file", np.uint32), ("row", np.uint32),
           ("values", np.float32))


@dataclass
class Mark:
    """A sink's state before a file's bars: what :meth:`Sink.rollback` returns to."""

    n: int
    names: int
    file_id: int
    intraday: bool


class Sink:
    """Collects normalised chunks as flat columns: in memory, or appended to one spill file per column.

    Args:
        fields: the values' fields, in order.
        spill: the spill files' common name (``<spill>.<column>``), or None to keep the bars in memory.
        expect: bars expected (in memory: the columns' first size).
    """

    def __init__(self, fields: list[str], spill: Path | None, expect: int = 0, round_stamps: bool = False) -> None:
        self.fields = fields
        self.round_stamps = round_stamps   # --round-stamps: seconds and fractions to the nearest minute
        self.spill = spill
        self.fh = {name: open(f"{spill}.{name}", "wb") for name, _ in COLUMNS} if spill else None
        self.cols: dict[str, np.ndarray] = {} if spill else self._alloc(max(expect, 1024))
        self.names: list[str] = []
        self.code: dict[str, int] = {}
        self.n = 0
        self.times_of_day: dict[int, np.ndarray] = {}   # per file: the times of day seen
        self.intraday = False
        self.stamps = StampSet()                         # the distinct stamps: the calendar's keys

    def _alloc(self, n: int) -> dict[str, np.ndarray]:
        nf = len(self.fields)
        return {name: np.empty((n, nf) if name == "values" else (n,), dtype=dtype) for name, dtype in COLUMNS}

    def _intern(self, name: str) -> int:
        code = self.code.get(name)
        if code is None:
            code = self.code[name] = len(self.names)
            self.names.append(name)
        return code

    def symbol_codes(self, col: pl.Series) -> np.ndarray:
        """Code of each row's symbol. Files are mostly grouped by symbol: map runs, not rows (polars' run-length
        encoding: 0.6x the time of comparing each row with the one before)."""
        runs = col.rle()
        if runs.len() * 8 < len(col):
            codes = np.asarray([self._intern(n) for n in runs.struct.field("value").to_list()], dtype=np.uint32)
            return np.repeat(codes, runs.struct.field("len").to_numpy())
        uniq = col.unique().to_list()
        return col.replace_strict(uniq, [self._intern(u) for u in uniq], return_dtype=pl.UInt32).to_numpy()

    def add(self, df: pl.DataFrame, file_id: int, path: Path) -> None:
        k = df.height
        if not self.fh and self.n + k > len(self.cols["sym"]):
            self._grow(self.n + k)
        lo, hi = self.n, self.n + k
        minute = self.cols["minute"][lo:hi] if not self.fh else np.empty(k, dtype=np.int64)
        self._stamps(df, minute, file_id, path)
        sym, row = self.symbol_codes(df["symbol"]), df["_row"].to_numpy()
        if self.fh:
            cols = {"sym": sym, "minute": minute, "row": row, "file": np.full(k, file_id, dtype=np.uint32),
                    "values": self._values(df)}
            try:
                for name, dtype in COLUMNS:
                    fh = self.fh[name]
                    at = fh.tell()
                    np.ascontiguousarray(cols[name], dtype=dtype).tofile(fh)
                    _start_writeback(fh, at)
            except OSError as exc:
                raise self._spill_error(exc, k) from None
        else:
            self.cols["sym"][lo:hi] = sym
            self.cols["row"][lo:hi] = row
            self.cols["file"][lo:hi] = file_id
            out = self.cols["values"][lo:hi]
            for j, f in enumerate(self.fields):   # straight into place: no [rows, fields] copy in between
                out[:, j] = df[f].to_numpy() if f in df.columns else np.nan
        self.n += k

    def _stamps(self, df: pl.DataFrame, minute: np.ndarray, file_id: int, path: Path) -> None:
        """Each row's stamp in minutes into ``minute``; the file's times of day and the chunk's distinct stamps
        noted. A block of rows at a time: its temporaries stay in the cache."""
        ms = df["date"].cast(pl.Int64).to_numpy()
        seen = self.times_of_day.setdefault(file_id, np.zeros(timeaxis.MINUTES_PER_DAY, dtype=bool))
        for a in range(0, len(ms), BLOCK):
            m, given = minute[a: a + BLOCK], ms[a: a + BLOCK]
            np.floor_divide(given, 60_000, out=m)
            if (m * 60_000 != given).any():
                if self.round_stamps:
                    np.floor_divide(given + 30_000, 60_000, out=m)
                else:
                    i = a + int(np.flatnonzero(m * 60_000 != given)[0])
                    raise InputError(f"{path}: {location(path, int(df['_row'][i]))}: time {df['date'][i]} has "
                                     f"seconds; bars are whole minutes (1 minute or longer); --round-stamps "
                                     f"rounds such stamps to the nearest minute")
            tod = m % timeaxis.MINUTES_PER_DAY
            seen[tod] = True
            self.stamps.add(m)
        # A daily file has one time of day (none, or its close like 15:00); a file with several holds bars
        # within a day. Decided per file: two daily files may well stamp their days differently.
        self.intraday |= int(np.count_nonzero(seen)) > 1

    def _spill_error(self, exc: OSError, k: int) -> Exception:
        """A write of the spill files failed: one line naming the store, the bytes and, when it is, a full disk
        (numpy's short write, "306920 requested and 118048 written", is a full disk too)."""
        assert self.spill is not None
        if exc.errno is None and "requested and" in str(exc):
            exc = OSError(errno.ENOSPC, str(exc))
        width = sum(np.dtype(d).itemsize * (len(self.fields) if n == "values" else 1) for n, d in COLUMNS)
        done = self.n * width
        store = self.spill.parent.parent     # <store>/<staging>/bars.spill
        return safefs.os_error(exc, store, f"spilling the bars read to {self.spill.parent} ({done:,} bytes spilled, "
                               f"{k * width:,} more for the next {k:,} bars; the spill takes about "
                               f"{width} bytes a bar)")

    def _values(self, df: pl.DataFrame) -> np.ndarray:
        return df.select([pl.col(f) if f in df.columns else pl.lit(None, dtype=pl.Float32).alias(f)
                          for f in self.fields]).to_numpy(order="c")

    def _grow(self, need: int) -> None:
        new = self._alloc(max(need, len(self.cols["sym"]) * 3 // 2))
        for name in new:
            new[name][: self.n] = self.cols[name][: self.n]
        self.cols = new

    def mark(self, file_id: int) -> Mark:
        """The state before file ``file_id``'s bars."""
        return Mark(self.n, len(self.names), file_id, self.intraday)

    def rollback(self, m: Mark) -> None:
        """Forget the bars added since ``m`` (a file read again from its start)."""
        for name in self.names[m.names:]:
            del self.code[name]
        del self.names[m.names:]
        self.times_of_day.pop(m.file_id, None)
        self.intraday = m.intraday
        if self.fh:
            for name, dtype in COLUMNS:
                width = np.dtype(dtype).itemsize * (len(self.fields) if name == "values" else 1)
                self.fh[name].flush()
                self.fh[name].seek(m.n * width)
                self.fh[name].truncate()
        self.n = m.n
        self.stamps = StampSet()       # marked again from the bars kept (a rare path: no copy at every file)
        minute = (np.fromfile(f"{self.spill}.minute", dtype=np.int64, count=m.n) if self.fh
                  else self.cols["minute"][: m.n])
        for a in range(0, m.n, BLOCK):
            self.stamps.add(minute[a: a + BLOCK])

    def columns(self) -> dict[str, np.ndarray]:
        nf = len(self.fields)
        out = {}
        for name, dtype in COLUMNS:
            shape = (self.n, nf) if name == "values" else (self.n,)
            if self.fh:
                self.fh[name].close()
                out[name] = (np.memmap(f"{self.spill}.{name}", dtype=dtype, mode="r", shape=shape)
                             if self.n else np.empty(shape, dtype))
            else:
                out[name] = self.cols[name][: self.n]
        return out

    def distinct(self) -> np.ndarray:
        """The distinct stamps of the bars (minutes, sorted)."""
        return self.stamps.values()

    def close(self) -> None:
        for fh in (self.fh or {}).values():
            fh.close()


class StampSet:
    """Distinct stamps (minutes), marked in a table over their span, which grows as stamps arrive (a byte per
    minute: 10 MiB for 20 years); beyond MAX_SPAN, each block's distinct stamps are kept instead."""

    MAX_SPAN = 1 << 26

    def __init__(self) -> None:
        self.lo = 0
        self.table: np.ndarray | None = None
        self.parts: list[np.ndarray] = []

    def add(self, m: np.ndarray) -> None:
        if not len(m):
            return
        a, b = int(m.min()), int(m.max())
        t = self.table
        if t is None and self.parts:
            self.parts.append(timeaxis.unique_keys(m))
            return
        if t is None or a < self.lo or b >= self.lo + len(t):
            lo = a if t is None else min(a, self.lo)
            hi = b if t is None else max(b, self.lo + len(t) - 1)
            if hi - lo >= self.MAX_SPAN:
                if t is not None:
                    self.parts.append(np.flatnonzero(t) + self.lo)
                self.table = None
                self.parts.append(timeaxis.unique_keys(m))
                return
            room = (hi - lo + 1) // 2 if t is not None else 0   # grown with room: amortised
            new = np.zeros(hi - lo + 1 + room, dtype=bool)
            if t is not None:
                new[self.lo - lo: self.lo - lo + len(t)] = t
            self.table, self.lo = new, lo
        self.table[m - self.lo] = True

    def values(self) -> np.ndarray:
        if self.table is not None:
            return np.flatnonzero(self.table) + self.lo
        return timeaxis.unique_keys(np.concatenate(self.parts)) if self.parts else np.zeros(0, dtype=np.int64)


def drop_pages(col: np.ndarray, lo: int = 0, hi: int | None = None) -> None:
    """Drop this process's resident pages of rows ``lo .. hi`` of a spilled column (as :meth:`Sink.columns` gave
    it): a pass over a big input stays bounded in memory. The mapping is read-only: nothing is written back and
    the pages stay in the page cache. A no-op for a column in memory."""
    mm = getattr(col, "_mmap", None) if isinstance(col, np.memmap) else None
    if mm is None or not len(col):
        return
    row, page = col.strides[0], mmap.PAGESIZE
    a = lo * row // page * page
    b = min(len(mm), -(-(len(col) if hi is None else hi) * row // page) * page)
    if b > a:
        mm.madvise(mmap.MADV_DONTNEED, a, b - a)


def _start_writeback(fh, at: int) -> None:
    """Start writing the bytes from ``at`` to disk now: dirty pages do not pile up under a memory limit, which a
    cgroup (v1) may not reclaim in time."""
    fh.flush()
    safefs.start_writeback(fh.fileno(), at, fh.tell() - at)
