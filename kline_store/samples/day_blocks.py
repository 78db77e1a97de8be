"""Day blocks: an O(blocks) index of cross-section items, for CrossSectionDataset's block order.

A cross-section item is a day with at least ``min_count`` valid windows (one per symbol). Its block is a run of
consecutive dates across every symbol row the dataset reads; the store is symbol-major, so a block is read as one
contiguous byte range of each row (its days plus the windows' and labels' halo): one large request a row, never a
4 KiB fault. The index keeps, per *segment* of ``seg_days`` dates (``SEG_ROW_BYTES`` of each row), how many of its
days are items: 4 bytes a segment, not a table of every window (``windows.by_day``: 8 bytes a window). Which days
are items, and which symbols' windows each holds (a bit per symbol), is computed when the segment is read, kept
while its block is live and dropped with its pages when the block leaves.

Item positions are the uniform order's (days ascending), so both orders deliver one multiset of days, and the block
order's pure functions (``feed/block_order.py``) run on the per-block counts of days as they do on windows.
Calendar windows only (``days="calendar"``). With a universe a day's windows are its members' (``member``), in the
counts and in the days and bits computed from them.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .windows import calendar_valid
from ..errors import InputError, StoreError
from ..feed.source import MAX_BLOCK_BYTES
from ..memory import Available, available, gib
from .blocks import FULL_INDEX_FRACTION, page_dropper, universe_key, window_bounds
from .count_cache import (cache_file, cache_key, cached, forget, ignore, read_arrays, sample_rng, save_arrays,
                          window_days)
from .block_pages import Mappings, mapping_base
from .spec import SamplePlan
from ..store.universes import Universe

SEG_ROW_BYTES = 4 << 10       # days per segment: about this many bytes of each row (blocks are whole segments)
CACHE_BYTES = 256 << 20       # computed segments kept at most (live blocks release theirs first; a worker process
                              # that gathers without them keeps this much): 1/192 of the bars they cover, 6 fields
MIN_POOL = 64                 # default pool: max(MIN_POOL, 8 x batch size) blocks (a block holds every symbol)
_SCAN_BYTES = 64 << 20        # bars read at a time when every segment is computed (``all_days``), and at most by
                              # the check of cached counts
SAMPLE_SEGMENTS = 16          # segments of cached counts counted again when they are loaded (at most)


def seg_days_for(n_fields: int) -> int:
    """Days per segment for rows of ``n_fields`` float32 fields."""
    return max(1, SEG_ROW_BYTES // (4 * max(1, n_fields)))


def day_table_bytes(n_symbols: int, n_dates: int, plan: SamplePlan) -> int:
    """Peak bytes of the by-day table (``windows.by_day``) at most: its mask of every cell and the mask's transposed
    copy, four int64 arrays of every window while it is sorted (the table keeps one)."""
    t_lo, t_hi = window_bounds(plan, n_dates)
    return 2 * n_symbols * n_dates + 32 * n_symbols * max(0, t_hi - t_lo + 1)


def choose_day_index(mode: str, n_symbols: int, n_dates: int, plan: SamplePlan, what: str,
                     avail: Available | None = None) -> str:
    """``"full"`` (the by-day table) or ``"blocks"`` (day blocks) for a cross-section over a dataset whose index is
    ``mode`` ("auto", "full"; "blocks" when it keeps the block index); one line when neither can be built."""
    if mode == "blocks":
        return "blocks"
    need = day_table_bytes(n_symbols, n_dates, plan)
    avail = available() if avail is None else avail
    if need <= avail.nbytes * FULL_INDEX_FRACTION:
        return "full"
    if mode == "auto" and plan.days == "calendar":
        return "blocks"
    hint = ("use days='calendar' (then the cross-section keeps 4 bytes per segment of days, index='blocks')"
            if plan.days == "symbol" else "pass index='blocks' (4 bytes per segment of days; "
            "loader(order='blocks'))")
    raise InputError(f"{what}: the by-day table of cross-sections needs {gib(need)} to build; {avail} (it may take "
                     f"{FULL_INDEX_FRACTION:.0%}); {hint}, or narrow start/end or the symbols")


class DayBlocks:
    """Item days counted per segment of consecutive dates; a segment's days and windows computed when it is read.

    Args:
        counts: item days per segment (segment k: window end days ``t_lo + k * seg_days`` onward).
        t_lo, t_hi: window end days covered.
        seg_days: days per segment.
        n_dates: calendar length (flat cells are ``s * n_dates + t``).
        rows: the symbol rows read, ascending (None: every row).
        min_count: fewest valid windows a day needs to be an item.
    """

    def __init__(self, counts: np.ndarray, t_lo: int, t_hi: int, seg_days: int, n_dates: int,
                 rows: np.ndarray | None, min_count: int) -> None:
        self.counts = np.ascontiguousarray(counts, dtype=np.int32).reshape(-1)
        self.t_lo, self.t_hi, self.seg_days, self.n_dates = int(t_lo), int(t_hi), int(seg_days), int(n_dates)
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self.min_count = max(1, int(min_count))
        self.cum = np.r_[0, np.cumsum(self.counts, dtype=np.int64)].astype(np.int64)
        self.n_segments = len(self.counts)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # k -> (days int32, bits uint8 [days, rows/8])
        self._cached_bytes = 0
        self._source: Any = None                                   # (panel, plan) to compute segments from
        self.pages = Mappings()                                    # whose pages prefetch and release advise
        self._store: Any = None   # whose advise_file drops released blocks from the page cache
        self._row_stride = self._n_fields = self._n_rows = 0
        self._lock = threading.Lock()
        self.compute_days = True    # False beside a by-day table: prefetch only reads pages
        self.origin: Path | None = None   # the cache file the counts came from (removed if found wrong in use)

    # -- building ------------------------------------------------------------------
    @classmethod
    def build(cls, panel: np.ndarray, plan: SamplePlan, rows: np.ndarray | None, min_count: int, seg_days: int,
              drop_pages: Any = None, member: Universe | None = None) -> DayBlocks:
        """Count the item days of every segment: valid windows per day summed over the rows, a few rows at a time
        (bounded temporaries; ``drop_pages(a, b)`` after each group of rows ``[a, b)``); ``member``: a window
        counts on its symbol's member days only."""
        n_sym, n_dates, n_fields = panel.shape
        t_lo, t_hi = window_bounds(plan, n_dates)
        span = max(0, t_hi - t_lo + 1)
        n_seg = -(-span // seg_days)
        if n_seg == 0:
            return cls(np.zeros(0, np.int32), t_lo, t_hi, seg_days, n_dates, rows, min_count)
        per_day = np.zeros(n_dates, dtype=np.int64)
        which = np.arange(n_sym, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        step = max(1, (1 << 22) // max(1, n_dates * n_fields))
        for i in range(0, len(which), step):
            part = which[i: i + step]
            a, b = int(part[0]), int(part[-1]) + 1
            whole = b - a == len(part)              # consecutive rows: a view, else a copy of these rows only
            valid = calendar_valid(panel[a:b] if whole else panel[part], plan, plan.lo, plan.hi)
            if member is not None:
                valid &= member.mask(part, 0, n_dates)
            per_day += valid.sum(axis=0)
            if drop_pages is not None:
                for r0, r1 in ([(a, b)] if whole else [(int(r), int(r) + 1) for r in part]):
                    drop_pages(r0, r1)
        item = np.pad(per_day[t_lo: t_hi + 1] >= max(1, int(min_count)), (0, n_seg * seg_days - span))
        counts = item.reshape(n_seg, seg_days).sum(axis=1, dtype=np.int32)
        return cls(counts, t_lo, t_hi, seg_days, n_dates, rows, min_count)

    @classmethod
    def from_days(cls, days: np.ndarray, plan: SamplePlan, n_dates: int, seg_days: int, rows: np.ndarray | None,
                  min_count: int) -> DayBlocks:
        """The segment counts of a by-day table's item days (same positions), for a dataset that has one."""
        t_lo, t_hi = window_bounds(plan, n_dates)
        n_seg = -(-max(0, t_hi - t_lo + 1) // seg_days)
        k = (np.asarray(days, dtype=np.int64) - t_lo) // seg_days
        return cls(np.bincount(k, minlength=n_seg), t_lo, t_hi, seg_days, n_dates, rows, min_count)

    def attach(self, store: Any, plan: SamplePlan, member: Universe | None = None) -> None:
        """Compute segments from ``store``'s panel (on ``member``'s days); advise its pages (its shared mapping, its
        pinned descriptor)."""
        self._source = (store.panel, plan, member)
        self._store, self._row_stride, self._n_fields = store, store.row_stride, store.n_fields
        self._n_rows = store.n_symbols if self.rows is None else len(self.rows)
        self.pages.set_shared(mapping_base(store.panel))

    def add_mapping(self, flat: np.ndarray) -> None:
        """A flat mapping of the data file (the gather's): read ahead and dropped with blocks, ``MADV_RANDOM``."""
        self.pages.add(flat)

    def state(self) -> dict[str, Any]:
        """What a pickled dataset carries, so that a worker process does not count again."""
        return {"counts": self.counts, "t_lo": self.t_lo, "t_hi": self.t_hi, "seg_days": self.seg_days,
                "n_dates": self.n_dates, "rows": self.rows, "min_count": self.min_count}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DayBlocks:
        return cls(state["counts"], state["t_lo"], state["t_hi"], state["seg_days"], state["n_dates"],
                   state["rows"], state["min_count"])

    # -- what it holds ---------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.cum[-1])

    @property
    def nbytes(self) -> int:
        return self.counts.nbytes + self.cum.nbytes + (self.rows.nbytes if self.rows is not None else 0)

    @property
    def segment_bytes(self) -> int:
        """Bytes of bars in one segment (its days of every row read)."""
        return self._n_rows * self.seg_days * self._n_fields * 4

    def _span(self, k0: int, k1: int) -> tuple[int, int]:
        """Window end days ``[a, b)`` of segments ``[k0, k1)``."""
        return self.t_lo + k0 * self.seg_days, min(self.t_hi + 1, self.t_lo + k1 * self.seg_days)

    # -- positions -> days and windows -----------------------------------------------------
    def windows(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(t, n, flat)`` of item positions ``pos``: each one's day, its number of windows, and their flat cells
        ``s * n_dates + t`` concatenated (by position, then symbol: the by-day table's order)."""
        pos = np.asarray(pos, dtype=np.int64).reshape(-1)
        if pos.size and (pos.min() < 0 or pos.max() >= len(self)):
            raise IndexError(f"day index out of range [0, {len(self)})")
        seg = np.searchsorted(self.cum, pos, "right") - 1
        j = pos - self.cum[seg]
        t = np.empty(len(pos), dtype=np.int64)
        bits = np.zeros((len(pos), -(-self._n_rows // 8)), dtype=np.uint8)
        for k in np.unique(seg):
            sel = np.flatnonzero(seg == k)
            days, packed = self.segment(int(k))
            t[sel] = days[j[sel]]
            bits[sel] = packed[j[sel]]
        p, r = np.nonzero(np.unpackbits(bits, axis=1, count=self._n_rows))
        sym = r if self.rows is None else self.rows[r]
        return t, np.bincount(p, minlength=len(pos)), sym * self.n_dates + t[p]

    def segment(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Item days of segment ``k`` and a bit per (day, row) for its valid windows, computed on first use."""
        got = self._cache.get(k)
        return got if got is not None else self._compute(k, k + 1)[k]

    def all_days(self) -> np.ndarray:
        """Every item's day, ascending (O(days); the store is read a group of segments at a time, nothing kept)."""
        group = max(1, _SCAN_BYTES // max(1, self.segment_bytes))
        parts = [d for k0 in range(0, self.n_segments, group)
                 for d, _ in self._compute(k0, min(self.n_segments, k0 + group), keep=False).values()]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def _items(self, k0: int, k1: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Item days of segments ``[k0, k1)`` and their windows' bits, counted from the panel."""
        if self._source is None:
            raise RuntimeError("DayBlocks has no store attached")
        panel, plan, member = self._source
        a, b = self._span(k0, k1)
        w, h = plan.window, plan.horizon
        d0, d1 = a - (w - 1), min(b + h, self.n_dates)       # the segments' days with their halo
        part = panel[:, d0:d1] if self.rows is None else panel[self.rows, d0:d1]
        valid = calendar_valid(part, plan, w - 1, min(b - 1 + h, plan.hi) - d0)[:, w - 1: w - 1 + (b - a)]
        if member is not None:
            valid &= member.mask(self.rows, a, b)
        item = valid.sum(axis=0) >= self.min_count
        out = {}
        for k in range(k0, k1):
            lo = self.t_lo + k * self.seg_days - a
            j = lo + np.flatnonzero(item[lo: lo + self.seg_days])
            out[k] = ((a + j).astype(np.int32), np.packbits(valid[:, j].T, axis=1))
        return out

    def _compute(self, k0: int, k1: int, keep: bool = True) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        out = self._items(k0, k1)
        for k, (days, _) in out.items():
            if len(days) != self.counts[k]:   # counts from a cache that escaped its check: never a wrong item
                forget(self.origin)
                raise StoreError(f"{self.origin or 'day counts'}: day segment {k}: {self.counts[k]} item days counted "
                                 f"before, {len(days)} in the store now; the cached counts were removed: create the "
                                 f"dataset again to count them")
        if keep:
            with self._lock:
                for k, v in out.items():
                    self._forget(k)
                    self._cache[k] = v
                    self._cached_bytes += v[0].nbytes + v[1].nbytes
                while self._cached_bytes > CACHE_BYTES and len(self._cache) > 1:
                    self._forget(next(iter(self._cache)))
        return out

    def check(self, store: Any) -> str | None:
        """What is wrong with counts loaded from a cache, against the attached store: a segment with more item days
        than the rows' bars allow (days when at least ``min_count`` rows may have a window), or a sample of segments
        (up to ``_SCAN_BYTES`` of bars) counted again and found different. None when they hold."""
        plan = self._source[1]
        lo, hi = window_days(store, plan, self.rows)
        alive = np.zeros(self.n_dates + 1, np.int64)
        ok = lo <= hi
        np.add.at(alive, np.clip(lo[ok], 0, self.n_dates), 1)
        np.add.at(alive, np.clip(hi[ok] + 1, 0, self.n_dates), -1)
        possible = np.cumsum(alive)[: self.n_dates] >= self.min_count
        k = np.arange(self.n_segments, dtype=np.int64)
        a = self.t_lo + k * self.seg_days
        b = np.minimum(a + self.seg_days, self.t_hi + 1)
        before = np.r_[0, np.cumsum(possible)]
        most = before[b] - before[a]
        bad = np.flatnonzero((self.counts > most) | (self.counts < 0))
        if len(bad):
            j = int(bad[0])
            return f"day segment {j}: {self.counts[j]} item days where the rows' bars allow {most[j]}"
        maybe = np.flatnonzero(most)
        n = max(1, min(SAMPLE_SEGMENTS, _SCAN_BYTES // max(1, self.segment_bytes)))
        for j in np.sort(sample_rng().choice(maybe, min(n, len(maybe)), replace=False)).tolist():
            got = len(self._items(j, j + 1)[j][0])
            if got != self.counts[j]:
                return f"day segment {j}: {self.counts[j]} item days cached, {got} counted"
        return None

    def _forget(self, k: int) -> None:
        v = self._cache.pop(k, None)
        if v is not None:
            self._cached_bytes -= v[0].nbytes + v[1].nbytes

    # -- residency ------------------------------------------------------------------------
    def _ranges(self, k0: int, k1: int, halo: bool) -> list[tuple[int, int]]:
        """Byte ranges of segments ``[k0, k1)`` in the data file: one per row read (with the windows' and labels'
        days when ``halo``)."""
        a, b = self._span(k0, k1)
        if halo and self._source is not None:
            plan = self._source[1]
            a, b = a - (plan.window - 1), b + plan.horizon
        nf = self._n_fields * 4
        rows = np.arange(self._n_rows, dtype=np.int64) if self.rows is None else self.rows
        start = rows * (self._row_stride * 4)
        lo, hi = start + max(a, 0) * nf, start + min(b, self.n_dates) * nf
        return list(zip(lo.tolist(), hi.tolist()))

    def prefetch(self, k0: int, k1: int) -> None:
        """Read segments ``[k0, k1)`` (every row's days and halo, a request a row) ahead, and compute them."""
        self.pages.read(self._ranges(k0, k1, True))
        if self.compute_days and self._source is not None and k1 > k0:
            self._compute(k0, k1)

    def release(self, k0: int, k1: int) -> None:
        """Forget segments ``[k0, k1)``: their days and bits, their pages here and in the page cache (their own
        days, whole pages inside them: the halo belongs to the neighbours)."""
        with self._lock:
            for k in range(k0, k1):
                self._forget(k)
        self.pages.drop(self._store, self._ranges(k0, k1, False))


def build_day_blocks(store: Any, plan: SamplePlan, rows: np.ndarray | None, min_count: int,
                     member: Universe | None = None, fresh: bool = False) -> DayBlocks:
    """The day blocks of a store: counts from the per-user cache (checked against the store: see
    :meth:`DayBlocks.check`), else counted (one pass over the rows, under the cache's lock: the ranks of a node
    count once). ``member``: each day's members only (in the cache key). ``fresh``: count without loading (and
    replace the cached counts)."""
    seg_days = seg_days_for(store.n_fields)
    min_count = max(1, int(min_count))
    which = "all" if rows is None else hashlib.sha256(np.asarray(rows, np.int64).tobytes()).hexdigest()[:16]
    path = cache_file(cache_key(store, plan, "days", seg_days, min_count, which, *universe_key(member)))
    t_lo, t_hi = window_bounds(plan, store.n_dates)
    n_seg = -(-max(0, t_hi - t_lo + 1) // seg_days)

    def load(p: Path) -> DayBlocks | None:
        z, problem = read_arrays(p, {"counts": (np.int32, (n_seg,)), "bounds": (np.int64, (4,))})
        if z is not None and z["bounds"].tolist() != [t_lo, t_hi, seg_days, store.n_dates]:
            problem = f"bounds {z['bounds'].tolist()}, expected {[t_lo, t_hi, seg_days, store.n_dates]}"
        if problem is None and z is not None:
            idx = DayBlocks(z["counts"], t_lo, t_hi, seg_days, store.n_dates, rows, min_count)
            idx.attach(store, plan, member)
            problem = idx.check(store)
            if problem is None:
                idx.origin = p
                return idx
        if problem is not None:
            ignore(p, problem)
        return None

    def count() -> DayBlocks:
        return DayBlocks.build(store.panel, plan, rows, min_count, seg_days, drop_pages=page_dropper(store),
                               member=member)

    def save(p: Path, d: DayBlocks) -> None:
        save_arrays(p, counts=d.counts, bounds=np.array([d.t_lo, d.t_hi, d.seg_days, d.n_dates], np.int64))

    idx = cached(path, load, count, save, fresh)
    if idx._source is None:
        idx.attach(store, plan, member)
    return idx


class DayBlockSource:
    """What a cross-section dataset offers the block order (``feed/block_feed.py``): one row of segments of days
    (``block_segments`` -> ``[1, n_segments]``), over the day blocks it keeps or over the counts of its by-day
    table. Mixed into CrossSectionDataset, which provides ``windows`` (its KlineDataset), ``_xs`` (DayBlocks or
    None), ``_days`` (the table's days), ``_rows()`` and ``min_count``."""

    windows: Any
    min_count: int
    _xs: DayBlocks | None
    _xs_view: DayBlocks | None   # day blocks over the by-day table, made for the block order
    _days: Any
    _rows: Any            # methods of the dataset
    _tables: Any

    @property
    def block_order_ok(self) -> bool:
        return self.windows.plan.days == "calendar"

    @property
    def keeps_full_index(self) -> bool:
        """Whether it keeps the by-day table (the uniform order's index)."""
        return self._xs is None

    def read_bytes(self) -> int:
        return self.windows.read_bytes()

    def full_index_bytes(self) -> int:
        """Bytes of building the by-day table (and the dataset's full index, when it keeps the block index)."""
        w, st = self.windows, self.windows.store
        extra = 0 if w.keeps_full_index else w.full_index_bytes()
        return extra + day_table_bytes(st.n_symbols, st.n_dates, w.plan)

    def block_defaults(self, batch_size: int) -> tuple[int, int]:
        """The loader's default pool (blocks hold every symbol: fewer than a dataset of windows needs) and the
        largest block (up to ``MAX_BLOCK_BYTES`` of each row)."""
        return max(MIN_POOL, 8 * int(batch_size)), MAX_BLOCK_BYTES * max(1, self._day_blocks()._n_rows)

    def _day_blocks(self) -> DayBlocks:
        if self._xs is not None:
            return self._xs
        view = self._xs_view
        if view is None:
            st, plan = self.windows.store, self.windows.plan
            self._tables()
            view = DayBlocks.from_days(self._days, plan, st.n_dates, seg_days_for(st.n_fields), self._rows(),
                                       self.min_count)
            view.compute_days = False   # positions resolve through the table
            view.attach(st, plan, self.windows.member)
            self._xs_view = view
        return view

    def block_segments(self) -> tuple[np.ndarray, int]:
        """Item days per segment ``[1, n_segments]`` and a segment's bytes (positions as ``self[i]``)."""
        if not self.block_order_ok:
            raise InputError("order='blocks' needs days='calendar' windows")
        gatherer = self.windows._cpu_gatherer()    # its mapping is advised with the blocks
        b = self._day_blocks()
        b.add_mapping(gatherer.panel_np)
        return b.counts[None, :], b.segment_bytes

    def prefetch_segments(self, row: int, k0: int, k1: int) -> None:
        self._day_blocks().prefetch(k0, k1)

    def release_segments(self, row: int, k0: int, k1: int) -> None:
        self._day_blocks().release(k0, k1)


__all__ = ["CACHE_BYTES", "MIN_POOL", "SEG_ROW_BYTES", "DayBlockSource", "DayBlocks", "build_day_blocks",
           "choose_day_index", "day_table_bytes", "seg_days_for"]
