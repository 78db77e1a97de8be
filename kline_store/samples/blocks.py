"""An O(segments) sample index for stores whose valid-window index does not fit in memory.

The uniform loader's index holds 4 bytes per window (``windows.valid_index``); a 72 GB minute store has billions of
windows. Here each symbol row's range of window end days is cut into *segments* of ``seg_bars`` days (about
64 KiB of bars) and only the number of valid windows per segment is kept (4 bytes per segment). Sample positions
are the same as the full index's (sorted by symbol, then day), so both orders see one multiset of samples.

Which windows of a segment are valid is computed when the segment is read: a segment whose count equals its days
is *dense* (``t = first day + j``, nothing to compute); others get their days computed from the panel and cached
while their block is live (``prefetch``), and dropped with its pages when it leaves (``release``: the mapping's
pages and the file's page cache, ``MADV_DONTNEED`` + ``POSIX_FADV_DONTNEED``), so neither the process nor the page
cache grows with the store.

Calendar windows only (``days="calendar"``, either ``missing``); symbol-day windows need the bar table. With a
universe (``KlineDataset(universe=...)``) a window counts only on its symbol's member days, in the counts and in the
days computed from them, so both orders keep seeing one multiset of samples.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .windows import calendar_valid
from ..errors import InputError, StoreError
from ..memory import Available, available, gib
from .count_cache import (cache_file, cache_key, cached, forget, ignore, overlap, read_arrays, sample_rng,
                          save_arrays, window_days)
from .block_pages import Mappings, drop_rows, mapping_base
from .segments import SegmentLookup
from .spec import SamplePlan
from ..store.universes import Universe
from ..feed.source import MAX_BLOCK_BYTES, default_pool

SEG_BYTES = 64 << 10          # bars per segment: about this many bytes of a row
FULL_INDEX_FRACTION = 0.5     # the full index (and its build) may take this share of the available memory
CACHE_SEGMENTS = 1 << 16      # computed segments kept at most (their live blocks release them first)
SAMPLE_SEGMENTS = 128         # segments of cached counts counted again when they are loaded (about 8 MiB read)


def window_bounds(plan: SamplePlan, n_dates: int) -> tuple[int, int]:
    """``[t_lo, t_hi]``: the window end days a calendar sample may have (empty when ``t_lo > t_hi``)."""
    return max(plan.lo, plan.window - 1), min(plan.hi, n_dates - 1) - plan.horizon


def full_index_bytes(n_symbols: int, n_dates: int, plan: SamplePlan) -> int:
    """Peak bytes of building the full valid-window index (``windows.valid_index``), at most: the bool mask of
    every cell, ``flatnonzero``'s int64 of every window, and the index itself (4 or 8 bytes a window)."""
    t_lo, t_hi = window_bounds(plan, n_dates)
    cells = n_symbols * n_dates
    windows = n_symbols * max(0, t_hi - t_lo + 1)
    item = 4 if cells < 2**31 else 8
    if plan.days == "symbol":   # the bar table too
        return cells + windows * 8 + windows * item + cells * item
    return cells + windows * (8 + item)


def choose_index(mode: str, n_symbols: int, n_dates: int, plan: SamplePlan, what: str,
                 avail: Available | None = None) -> str:
    """``"full"`` or ``"blocks"`` for ``index=mode`` ("auto", "full", "blocks"); one-line InputError when neither
    can be built (a full index that does not fit, or block index for symbol-day windows)."""
    if mode not in ("auto", "full", "blocks"):
        raise InputError(f"index={mode!r}: expected 'auto', 'full' or 'blocks'")
    need = full_index_bytes(n_symbols, n_dates, plan)
    if mode == "blocks" or (mode == "auto" and plan.days == "calendar"):
        if mode == "blocks" and plan.days == "symbol":
            raise InputError("index='blocks' supports days='calendar' windows; days='symbol' needs the full index")
        if mode == "blocks":
            return "blocks"
        avail = available() if avail is None else avail
        return "full" if need <= avail.nbytes * FULL_INDEX_FRACTION else "blocks"
    avail = available() if avail is None else avail
    if need > avail.nbytes * FULL_INDEX_FRACTION:
        hint = ("use days='calendar' (then the dataset keeps 4 bytes per 64 KiB segment, index='blocks')"
                if plan.days == "symbol" else "pass index='blocks' (4 bytes per 64 KiB segment; "
                "ds.loader(order='blocks'))")
        raise InputError(f"{what}: the valid-window index needs {gib(need)} to build; {avail} (it may take "
                         f"{FULL_INDEX_FRACTION:.0%}); {hint}, or narrow start/end or the symbols")
    return "full"


class BlockIndex:
    """Valid-window counts per segment of each symbol row; positions resolved a segment at a time.

    Args:
        counts: int32 ``[n_symbols, n_segments]`` valid windows per segment.
        t_lo, t_hi: window end days covered (segment k of a row: ``t_lo + k * seg_bars`` onward).
        seg_bars: days per segment.
        n_dates: calendar length (flat cells are ``s * n_dates + t``).
    """

    def __init__(self, counts: np.ndarray, t_lo: int, t_hi: int, seg_bars: int, n_dates: int) -> None:
        self.counts = np.ascontiguousarray(counts, dtype=np.int32)
        self.t_lo, self.t_hi, self.seg_bars, self.n_dates = int(t_lo), int(t_hi), int(seg_bars), int(n_dates)
        self.cum = np.r_[0, np.cumsum(self.counts.reshape(-1), dtype=np.int64)].astype(np.int64)
        self.n_segments = self.counts.shape[1]
        days = self.seg_days(np.arange(self.n_segments))
        self.dense = self.counts == days[None, :]          # [rows, segs]: every day of the segment is a sample
        self._lookup: SegmentLookup | None = None           # made on first use (a dataset may never gather)
        self._cache: dict[int, np.ndarray] = {}
        self._source: Any = None                             # (panel, plan) to compute segments from
        self.pages = Mappings()                              # whose pages prefetch and release advise
        self._store: Any = None   # whose advise_file drops released blocks from the page cache
        self._row_stride = 0
        self._n_fields = 0
        self._lock = threading.Lock()
        self.compute_days = True    # False beside a full index: prefetch only reads pages
        self.origin: Path | None = None   # the cache file the counts came from (removed if found wrong in use)

    # -- building ------------------------------------------------------------------
    @classmethod
    def build(cls, panel: np.ndarray, plan: SamplePlan, seg_bytes: int = SEG_BYTES,
              drop_pages: Any = None, member: Universe | None = None) -> BlockIndex:
        """Count the valid windows of every segment, a few rows at a time (bounded temporaries).

        ``drop_pages(rows)`` is called after each group of rows is counted (to drop their pages from the cache:
        counting a store bigger than memory must not evict everything else). ``member``: count a window only on a
        member day of its symbol.
        """
        n_sym, n_dates, n_fields = panel.shape
        seg_bars = max(1, seg_bytes // (4 * n_fields))
        t_lo, t_hi = window_bounds(plan, n_dates)
        span = max(0, t_hi - t_lo + 1)
        n_seg = -(-span // seg_bars) if span else 0
        counts = np.zeros((n_sym, n_seg), dtype=np.int32)
        if n_seg:
            step = max(1, (1 << 22) // max(1, n_dates * n_fields))
            for a in range(0, n_sym, step):
                b = min(n_sym, a + step)
                valid = calendar_valid(panel[a:b], plan, plan.lo, plan.hi)[:, t_lo: t_hi + 1]
                if member is not None:
                    valid &= member.mask(slice(a, b), t_lo, t_hi + 1)
                pad = n_seg * seg_bars - span
                if pad:
                    valid = np.pad(valid, ((0, 0), (0, pad)))
                counts[a:b] = valid.reshape(b - a, n_seg, seg_bars).sum(axis=2, dtype=np.int32)
                if drop_pages is not None:
                    drop_pages(a, b)
        return cls(counts, t_lo, t_hi, seg_bars, n_dates)

    @classmethod
    def from_full(cls, valid: np.ndarray, plan: SamplePlan, n_symbols: int, n_dates: int, n_fields: int,
                  seg_bytes: int = SEG_BYTES) -> BlockIndex:
        """The segment counts of a full index (same positions), for a dataset that has one."""
        seg_bars = max(1, seg_bytes // (4 * n_fields))
        t_lo, t_hi = window_bounds(plan, n_dates)
        n_seg = -(-max(0, t_hi - t_lo + 1) // seg_bars)
        s, t = np.divmod(np.asarray(valid, dtype=np.int64), n_dates)
        g = s * n_seg + (t - t_lo) // seg_bars
        counts = np.bincount(g, minlength=n_symbols * n_seg).reshape(n_symbols, n_seg)
        return cls(counts, t_lo, t_hi, seg_bars, n_dates)

    def keep_rows(self, rows: np.ndarray) -> None:
        """Only these symbol rows have windows (``symbols=``): the others' counts become 0."""
        out = np.ones(len(self.counts), dtype=bool)
        out[np.asarray(rows, dtype=np.int64)] = False
        self.counts[out] = 0
        self.cum = np.r_[0, np.cumsum(self.counts.reshape(-1), dtype=np.int64)].astype(np.int64)
        days = self.seg_days(np.arange(self.n_segments))
        self.dense = self.counts == days[None, :]
        self._lookup = None
        self._cache.clear()

    def attach(self, panel: np.ndarray, plan: SamplePlan, store: Any, row_stride: int, n_fields: int,
               member: Universe | None = None) -> None:
        """What segments are computed from (the store's panel, the universe its counts kept) and whose pages
        prefetch and release advise (``store``: its ``advise_file``, or None)."""
        self._source = (panel, plan, member)
        self._store, self._row_stride, self._n_fields = store, row_stride, n_fields

    def add_mapping(self, flat: np.ndarray) -> None:
        """A flat mapping of the data file (the gather's): its pages are populated and dropped with blocks.

        The mapping is marked ``MADV_RANDOM``: a page fault then reads its page, not the device's read-around
        (``read_ahead_kb``, 8 MiB on some virtual disks: 64 blocks' worth per fault). Blocks are read ahead
        exactly, with ``MADV_WILLNEED`` over their byte range.
        """
        self.pages.add(flat)

    # -- what it holds ----------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.cum[-1])

    @property
    def nbytes(self) -> int:
        # the lookup once made: 8 + 8 + 4 bytes per non-empty segment (about)
        lookup = 20 * int(np.count_nonzero(self.counts)) if self._lookup is None else self._lookup.nbytes
        return self.counts.nbytes + self.cum.nbytes + self.dense.nbytes + lookup

    def day_span(self, window: int, horizon: int) -> tuple[int, int]:
        """``(d0, d1)``: calendar days any sample reads (from the first and last non-empty segments)."""
        used = np.flatnonzero(self.counts.any(axis=0))
        if len(used) == 0:
            return 0, 0
        k0, k1 = int(used[0]), int(used[-1])
        first = min(int(self.segment_first_day(s, k0)) for s in np.flatnonzero(self.counts[:, k0]))
        last = max(int(self.segment_last_day(s, k1)) for s in np.flatnonzero(self.counts[:, k1]))
        return first - (window - 1), last + horizon + 1

    def segment_first_day(self, s: int, k: int) -> int:
        g = s * self.n_segments + k
        return self.t_lo + k * self.seg_bars if self.dense[s, k] else int(self.segment_days(g)[0])

    def segment_last_day(self, s: int, k: int) -> int:
        g = s * self.n_segments + k
        if self.dense[s, k]:
            return self.t_lo + k * self.seg_bars + int(self.counts[s, k]) - 1
        return int(self.segment_days(g)[-1])

    def seg_days(self, k: np.ndarray) -> np.ndarray:
        """Days (window end days) of segments ``k``."""
        a = self.t_lo + np.asarray(k, dtype=np.int64) * self.seg_bars
        return np.minimum(a + self.seg_bars, self.t_hi + 1) - a

    def state(self) -> dict[str, Any]:
        """What a pickled dataset carries, so that a worker process does not count again."""
        return {"counts": self.counts, "t_lo": self.t_lo, "t_hi": self.t_hi, "seg_bars": self.seg_bars,
                "n_dates": self.n_dates}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BlockIndex:
        return cls(state["counts"], state["t_lo"], state["t_hi"], state["seg_bars"], state["n_dates"])

    # -- positions -> cells -------------------------------------------------------------
    def __getitem__(self, idx: Any) -> Any:
        """Flat cells ``s * n_dates + t`` of sample positions (an int gives an int)."""
        scalar = np.ndim(idx) == 0
        pos = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        if pos.size and (pos.min() < 0 or pos.max() >= len(self)):
            raise IndexError(f"sample index out of range [0, {len(self)})")
        if self._lookup is None:
            self._lookup = SegmentLookup(self.cum)
        seg = self._lookup(pos)
        j = pos - self.cum[seg]
        s, k = np.divmod(seg, max(self.n_segments, 1))
        t = self.t_lo + k * self.seg_bars + j          # right for dense segments
        sparse = ~self.dense.reshape(-1)[seg]
        if sparse.any():
            where = np.flatnonzero(sparse)
            for g in np.unique(seg[where]):
                sel = where[seg[where] == g]
                t[sel] = self.segment_days(int(g))[j[sel]]
        flat = s * self.n_dates + t
        return int(flat[0]) if scalar else flat

    def segment_days(self, g: int) -> np.ndarray:
        """Window end days of the valid windows of segment ``g`` (flat segment id), computed on first use."""
        ts = self._cache.get(g)
        if ts is None:
            s, k = divmod(g, self.n_segments)
            self._compute(s, k, k + 1)
            ts = self._cache[g]
        return ts

    def _valid_days(self, s: int, k0: int, k1: int) -> dict[int, np.ndarray]:
        """Window end days of the valid windows of row s's segments ``[k0, k1)``, counted from the panel."""
        if self._source is None:
            raise RuntimeError("BlockIndex has no panel attached")
        panel, plan, member = self._source
        a = self.t_lo + k0 * self.seg_bars
        b = min(self.t_hi + 1, self.t_lo + k1 * self.seg_bars)
        hi = min(b - 1 + plan.horizon, plan.hi)
        valid = calendar_valid(panel[s: s + 1], plan, max(a, plan.lo), hi)[0]
        if member is not None:
            valid[a:b] &= member.mask(slice(s, s + 1), a, b)[0]
        out = {}
        for k in range(k0, k1):
            lo = self.t_lo + k * self.seg_bars
            out[k] = (lo + np.flatnonzero(valid[lo: min(lo + self.seg_bars, self.t_hi + 1)])).astype(np.int32)
        return out

    def _compute(self, s: int, k0: int, k1: int) -> None:
        days = self._valid_days(s, k0, k1)
        for k, ts in days.items():
            if len(ts) != self.counts[s, k]:   # counts from a cache that escaped its check: never a wrong window
                forget(self.origin)
                raise StoreError(f"{self.origin or 'block counts'}: symbol row {s}, segment {k}: {self.counts[s, k]} "
                                 f"windows counted before, {len(ts)} in the store now; the cached counts were "
                                 f"removed: create the dataset again to count them")
        base = s * self.n_segments
        with self._lock:
            for k, ts in days.items():
                self._cache[base + k] = ts
            while len(self._cache) > CACHE_SEGMENTS:
                self._cache.pop(next(iter(self._cache)))

    def check(self, store: Any, sample: int | None = None) -> str | None:
        """What is wrong with counts loaded from a cache, against the attached store: a segment with more windows
        than its rows' bars allow (``first_bar``/``last_bar``), more windows than the store has bars, or a sample of
        ``sample`` segments that may hold windows (default ``SAMPLE_SEGMENTS``) counted again and found different. None
        when they hold."""
        plan = self._source[1]
        k = np.arange(self.n_segments, dtype=np.int64)
        a = self.t_lo + k * self.seg_bars
        most = overlap(*window_days(store, plan), a, np.minimum(a + self.seg_bars, self.t_hi + 1))
        bad = np.argwhere((self.counts > most) | (self.counts < 0))
        if len(bad):
            s, j = (int(v) for v in bad[0])
            return (f"symbol {store.symbols[s]!r}, segment {j}: {self.counts[s, j]} windows where its bars allow "
                    f"{most[s, j]}")
        total = len(self)
        bars = int(store.manifest.get("n_bars", total))
        if total > bars:
            return f"{total:,} windows, more than the store's {bars:,} bars"
        maybe = np.flatnonzero(most.reshape(-1))
        sample = SAMPLE_SEGMENTS if sample is None else sample
        for g in np.sort(sample_rng().choice(maybe, min(sample, len(maybe)), replace=False)):
            s, j = divmod(int(g), self.n_segments)
            n = len(self._valid_days(s, j, j + 1)[j])
            if n != self.counts[s, j]:
                return f"symbol {store.symbols[s]!r}, segment {j}: {self.counts[s, j]} windows cached, {n} counted"
        return None

    # -- residency ------------------------------------------------------------------------
    def _bytes(self, s: int, k0: int, k1: int, halo: bool) -> tuple[int, int]:
        """Byte range in the data file of row s's segments ``[k0, k1)`` (with the windows' and labels' days)."""
        nf = self._n_fields * 4
        a = self.t_lo + k0 * self.seg_bars
        b = min(self.t_hi + 1, self.t_lo + k1 * self.seg_bars)
        if halo and self._source is not None:
            plan = self._source[1]
            a, b = a - (plan.window - 1), b + plan.horizon
        row = s * self._row_stride * 4
        return row + max(a, 0) * nf, row + min(b, self.n_dates) * nf

    def prefetch(self, s: int, k0: int, k1: int) -> None:
        """Read row s's segments ``[k0, k1)`` (with their halo) ahead, map them, compute the sparse ones."""
        self.pages.read([self._bytes(s, k0, k1, True)])
        sparse = ~self.dense[s, k0:k1]
        if sparse.any() and self._source is not None and self.compute_days:
            ks = k0 + np.flatnonzero(sparse)
            self._compute(s, int(ks[0]), int(ks[-1]) + 1)

    def release(self, s: int, k0: int, k1: int) -> None:
        """Forget row s's segments ``[k0, k1)``: their days, their pages in this process and in the page cache
        (the segments' own days, whole pages inside them: the halo belongs to the neighbours)."""
        base = s * self.n_segments
        for k in range(k0, k1):
            self._cache.pop(base + k, None)
        self.pages.drop(self._store, [self._bytes(s, k0, k1, False)])


def attach_store(index: BlockIndex, store: Any, plan: SamplePlan, member: Universe | None = None) -> None:
    """Compute segments from ``store``'s panel (on ``member``'s days); advise its pages (its shared mapping, its
    pinned descriptor)."""
    index.attach(store.panel, plan, store, store.row_stride, store.n_fields, member)
    index.pages.set_shared(mapping_base(store.panel))


def build_blocks(store: Any, plan: SamplePlan, member: Universe | None = None, fresh: bool = False) -> BlockIndex:
    """The block index of a store: segment counts from the per-user cache (checked against the store: see
    :meth:`BlockIndex.check`), else counted (one pass over the store; the process that counts holds a lock, so the
    ranks of a node started together count once and the others load its result). Counting drops each group of rows
    from the page cache behind it when the store is bigger than half the available memory (a pass over it must not
    evict everything else). ``member``: windows on its member days only (the universe's spans enter the cache key).
    ``fresh``: count without loading (and replace the cached counts)."""
    path = cache_file(cache_key(store, plan, SEG_BYTES, *universe_key(member)))
    n_fields = store.n_fields
    seg_bars = max(1, SEG_BYTES // (4 * n_fields))
    t_lo, t_hi = window_bounds(plan, store.n_dates)
    span = max(0, t_hi - t_lo + 1)
    shape = (store.n_symbols, -(-span // seg_bars) if span else 0)

    def load(p: Path) -> BlockIndex | None:
        z, problem = read_arrays(p, {"counts": (np.int32, shape), "bounds": (np.int64, (4,))})
        if z is not None and z["bounds"].tolist() != [t_lo, t_hi, seg_bars, store.n_dates]:
            problem = f"bounds {z['bounds'].tolist()}, expected {[t_lo, t_hi, seg_bars, store.n_dates]}"
        if problem is None and z is not None:
            idx = BlockIndex(z["counts"], t_lo, t_hi, seg_bars, store.n_dates)
            attach_store(idx, store, plan, member)
            problem = idx.check(store)
            if problem is None:
                idx.origin = p
                return idx
        if problem is not None:
            ignore(p, problem)
        return None

    def count() -> BlockIndex:
        return BlockIndex.build(store.panel, plan, drop_pages=page_dropper(store), member=member)

    def save(p: Path, i: BlockIndex) -> None:
        save_arrays(p, counts=i.counts, bounds=np.array([i.t_lo, i.t_hi, i.seg_bars, i.n_dates], np.int64))

    idx = cached(path, load, count, save, fresh)
    if idx._source is None:
        attach_store(idx, store, plan, member)
    return idx


def universe_key(member: Universe | None) -> tuple[str, ...]:
    """What a universe adds to a cache key: its name and a hash of its spans on the store's calendar."""
    return () if member is None else ("universe", member.name, member.digest)


def page_dropper(store: Any) -> Callable[[int, int], None] | None:
    """What a counting pass calls after each group of rows ``[a, b)``: drop them from the page cache when the
    store is bigger than half the available memory (a pass over it must not evict everything else)."""
    if store.panel.nbytes > available().nbytes * FULL_INDEX_FRACTION:
        return lambda a, b: drop_rows(store, a, b)
    return None


class BlockSource:
    """What a dataset of calendar windows offers the block order (``feed/block_feed.py``) and the ranks' agreement
    (``feed/agreement.py``), over the block index it keeps, or over the segment counts of its full index. Mixed into
    KlineDataset, which provides ``store``, ``plan``, ``member``, ``_valid``, ``_index()``, ``_build_index()``,
    ``_cpu`` and ``_cpu_gatherer()``."""

    store: Any
    plan: SamplePlan
    member: Universe | None   # the dataset's universe: windows on member days only
    _cpu: Any
    _valid: Any
    _index: Any            # methods of the dataset
    _cpu_gatherer: Any
    _build_index: Any

    def sample_digest(self) -> str:
        """The number of samples and a checksum of the block counts they come from (the same on ranks whose
        datasets hold the same samples): what the ranks of a loader compare before the first step."""
        v = self._index()
        counts = zlib.crc32(v.counts.tobytes()) if isinstance(v, BlockIndex) else 0
        return f"{len(v):,} samples (counts {counts:08x})"

    def recount(self) -> None:
        """Count the block index again from the store, not trusting the cache (the ranks disagreed)."""
        if isinstance(self._valid, BlockIndex):
            self._build_index(fresh=True)
            self._cpu = None   # its mapping is advised by the new index

    @property
    def block_order_ok(self) -> bool:
        return self.plan.days == "calendar"

    @property
    def keeps_full_index(self) -> bool:
        return not isinstance(self._index(), BlockIndex)

    def block_defaults(self, batch_size: int) -> tuple[int, int]:
        """The loader's default pool of live blocks, and the largest block (``MAX_BLOCK_BYTES`` of a row)."""
        return default_pool(batch_size), MAX_BLOCK_BYTES

    def read_bytes(self) -> int:
        """Bytes of the store samples read (every field of the days any sample reads: what the page cache holds)."""
        st, p = self.store, self.plan
        t_lo, t_hi = window_bounds(p, st.n_dates)   # O(1): the bounds, not the index
        return st.n_symbols * max(0, t_hi + p.horizon - t_lo + p.window) * st.n_fields * 4

    def full_index_bytes(self) -> int:
        return full_index_bytes(self.store.n_symbols, self.store.n_dates, self.plan)

    def _blocks(self) -> BlockIndex:
        v = self._index()
        if isinstance(v, BlockIndex):
            return v
        view = getattr(self, "_block_view", None)
        if view is None:
            st = self.store
            view = BlockIndex.from_full(v, self.plan, st.n_symbols, st.n_dates, st.n_fields)
            view.compute_days = False   # positions resolve through the full index
            attach_store(view, st, self.plan, self.member)
            if self._cpu is not None:
                view.add_mapping(self._cpu.panel_np)
            self._block_view = view
        return view

    def block_segments(self) -> tuple[np.ndarray, int]:
        """Valid windows per segment ``[n_symbols, n_segments]`` and a segment's bytes (positions as ``self[i]``)."""
        if not self.block_order_ok:
            raise InputError("order='blocks' needs days='calendar' windows")
        self._cpu_gatherer()   # first: its mapping is advised with the blocks
        b = self._blocks()
        return b.counts, b.seg_bars * self.store.n_fields * 4

    def prefetch_segments(self, row: int, k0: int, k1: int) -> None:
        self._blocks().prefetch(row, k0, k1)

    def release_segments(self, row: int, k0: int, k1: int) -> None:
        self._blocks().release(row, k0, k1)


__all__ = ["CACHE_SEGMENTS", "FULL_INDEX_FRACTION", "SAMPLE_SEGMENTS", "SEG_BYTES", "BlockIndex", "BlockSource",
           "attach_store", "build_blocks", "choose_index", "full_index_bytes", "page_dropper", "universe_key",
           "window_bounds"]
