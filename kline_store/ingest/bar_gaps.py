"""Gaps between consecutive bars of a group (a file's symbol, a symbol's day) without sorting all bars.

The bar size is told from such gaps: in days per input file (barsize.py) and in minutes within a symbol's day
(intraday, timeaxis.detect_freq / finer_than). Their reference definitions sort every bar by group and time.
Inputs nearly always come grouped already, each group's bars together and in time order (oldest or newest
first): then the pairs of neighbours within each run are the very pairs sorting would make, so they are read a
chunk of bars at a time, with temporaries bounded by the chunk whatever the input size. An input that is not so
grouped raises :class:`NotGrouped` and the caller sorts (memory proportional to the bars).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..store import timeaxis
from .sink import drop_pages

STEP = 1 << 16            # bars looked at per chunk: temporaries that stay in the cache
MAX_TABLE = 1 << 26       # groups marked in a table up to this many (one byte each); a list of run keys beyond

Slice = Callable[[int, int], np.ndarray]   # (lo, hi) -> int64 values of bars lo..hi-1


class NotGrouped(Exception):
    """A group's bars are split or out of time order: the caller sorts instead."""


@dataclass
class GapChunk:
    """Bars ``first .. first + len(t) - 1`` and the pairs of neighbours among them: pair ``p`` joins bars ``p``
    and ``p + 1`` (of this chunk); ``same[p]`` when both are of one group, ``d[p]`` the later time minus the
    earlier in file order (0 where ``same`` is False)."""

    first: int
    group: np.ndarray
    t: np.ndarray
    same: np.ndarray
    d: np.ndarray


def chunks(n: int, group: Slice, time: Slice, n_groups: int, step: int | None = None) -> Iterator[GapChunk]:
    """The bars a chunk at a time, each chunk beginning with the last bar of the one before (so every pair of
    neighbours is in exactly one chunk).

    Raises:
        NotGrouped: a group's bars do not come together, or not in time order (oldest or newest first).
    """
    seen = np.zeros(n_groups, dtype=bool) if n_groups <= MAX_TABLE else None
    starts: list[np.ndarray] = []
    up_open = down_open = False                 # direction of the run still open at a chunk's end
    step = step or STEP
    for lo in range(0, n, step):
        a, hi = max(lo - 1, 0), min(lo + step, n)
        k, t = group(a, hi), time(a, hi)
        same = k[1:] == k[:-1]
        brk = np.flatnonzero(~same)
        new = k[brk + 1]                        # groups whose run starts in this chunk
        if lo == 0:
            new = np.r_[k[:1], new]
        if seen is not None:
            u = np.unique(new)
            if len(u) != len(new) or seen[u].any():
                raise NotGrouped
            seen[u] = True
        else:
            starts.append(new)
        d = np.where(same, t[1:] - t[:-1], 0)
        if len(d):
            # Each run's pairs all rise or all fall (ties aside); run 0 continues the one open before the chunk.
            seg = np.r_[0, brk + 1]
            seg = seg[seg < len(d)]
            up, down = np.maximum.reduceat(d, seg) > 0, np.minimum.reduceat(d, seg) < 0
            if lo:
                up[0] |= up_open
                down[0] |= down_open
            if (up & down).any():
                raise NotGrouped
            # the run open at the end: the last segment, unless the chunk's last bar starts a new one
            open_new = not same[-1]
            up_open, down_open = (False, False) if open_new else (bool(up[-1]), bool(down[-1]))
        yield GapChunk(a, k, t, same, d)
    if seen is None and starts:
        every = np.concatenate(starts)
        if len(np.unique(every)) != len(every):
            raise NotGrouped


@dataclass
class SymbolGaps:
    """Per symbol (over every file): its gaps counted by class (``classes``: gap -> class index, the last class
    for pairs of two symbols) and whether it has two bars in one week, in one month."""

    counts: np.ndarray     # [n_sym, n_classes + 1]
    week: np.ndarray
    month: np.ndarray


def day_gaps(days: Slice, sym: Slice, file: Slice, n: int, n_sym: int, n_files: int, clip: int,
             classes: np.ndarray | None = None, per_symbol: list | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per file: a histogram [n_files, clip + 1] of the gaps in days between a symbol's consecutive bars (gaps
    above ``clip`` counted as ``clip``), and whether it has two bars of a symbol in one week, in one month (see
    barsize.by_file). With ``classes`` (gap 0..clip -> class), the same per symbol, appended to ``per_symbol``
    as a :class:`SymbolGaps` (gaps counted by class only: a few bytes a symbol)."""
    hist = np.zeros((n_files, clip + 2), dtype=np.int64)     # the last column: pairs of two groups
    week = np.zeros(n_files, dtype=bool)
    month = np.zeros(n_files, dtype=bool)
    n_cls = int(classes.max()) + 2 if classes is not None else 0
    table = np.r_[classes, n_cls - 1] if classes is not None else None     # clip + 1 (two groups) -> last
    s_counts = np.zeros((max(n_sym, 1), n_cls), dtype=np.int64) if classes is not None else None
    s_week = np.zeros(max(n_sym, 1), dtype=bool)
    s_month = np.zeros(max(n_sym, 1), dtype=bool)
    n_sym = max(n_sym, 1)
    month_of: np.ndarray | None = None
    day0 = 0
    for c in chunks(n, lambda a, b: file(a, b) * n_sym + sym(a, b), days, n_sym * max(n_files, 1)):
        f = c.group[1:] // n_sym
        if not len(f):
            continue
        g = np.where(c.same, np.minimum(np.abs(c.d), clip), clip + 1)
        f0, f1 = int(f.min()), int(f.max()) + 1      # files are read one after the other: a few per chunk
        hist[f0:f1] += np.bincount((f - f0) * (clip + 2) + g, minlength=(f1 - f0) * (clip + 2)).reshape(-1, clip + 2)
        w = (c.t + 3) // 7
        same_week = c.same & (w[1:] == w[:-1])
        week[f[same_week]] = True
        if s_counts is not None:
            s = c.group[1:] % n_sym
            s0, s1 = int(s.min()), int(s.max()) + 1
            s_counts[s0:s1] += np.bincount((s - s0) * n_cls + table[g], minlength=(s1 - s0) * n_cls
                                           ).reshape(-1, n_cls)
            s_week[s[same_week]] = True
        if month_of is None or c.t.min() < day0 or c.t.max() - day0 >= len(month_of):
            day0 = int(c.t.min())
            span = np.arange(day0, max(int(c.t.max()) + 1, day0 + 1), dtype=np.int64)
            month_of = span.astype("datetime64[D]").astype("datetime64[M]").astype(np.int64)
        m = month_of[c.t - day0]
        same_month = c.same & (m[1:] == m[:-1])
        month[f[same_month]] = True
        if s_counts is not None:
            s_month[(c.group[1:] % n_sym)[same_month]] = True
    if per_symbol is not None and s_counts is not None:
        per_symbol.append(SymbolGaps(s_counts[:, : n_cls - 1], s_week, s_month))
    return hist[:, : clip + 1], week, month


def median(hist: np.ndarray) -> float:
    """np.median of the values a histogram (count of each value 0, 1, 2, ...) holds."""
    cum = np.cumsum(hist)
    total = int(cum[-1])
    lo = int(np.searchsorted(cum, (total - 1) // 2, side="right"))
    hi = int(np.searchsorted(cum, total // 2, side="right"))
    return (lo + hi) / 2


def minute_gaps(minute: Slice, sym: Slice, n: int, n_sym: int, day0: int, n_days: int, finer: int | None = None
                ) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Gaps in minutes between a symbol's consecutive bars of one day, at different stamps: (distinct gaps, their
    counts, and with ``finer`` the index of the first bar, in symbol then time order, less than ``finer`` minutes
    after the previous one, or None). As timeaxis._same_day_gaps, without sorting."""
    per_day = timeaxis.MINUTES_PER_DAY
    counts = np.zeros(per_day + 1, dtype=np.int64)
    best: tuple[int, int, int] | None = None     # (symbol, earlier stamp, later bar)
    n_days = max(n_days, 1)

    def group(a: int, b: int) -> np.ndarray:
        return sym(a, b) * n_days + (minute(a, b) // per_day - day0)

    for c in chunks(n, group, minute, max(n_sym, 1) * n_days):
        gap = np.abs(c.d)                       # within one day: < 1440; 0 between groups
        counts += np.bincount(gap, minlength=per_day + 1)
        if finer is not None:
            hit = np.flatnonzero((gap > 0) & (gap < finer))
            if hit.size:
                rising = c.d[hit] > 0
                early = np.where(rising, c.t[hit], c.t[hit + 1])
                later = np.where(rising, hit + 1, hit) + c.first
                s = c.group[hit] // n_days
                j = int(np.lexsort((early, s))[0])
                cand = (int(s[j]), int(early[j]), int(later[j]))
                best = cand if best is None or cand[:2] < best[:2] else best
    values = np.flatnonzero(counts[1:]) + 1
    return values, counts[values], None if best is None else best[2]


def column(arr: np.ndarray, div: int = 1) -> Slice:
    """A bar column as a :data:`Slice` (int64, floor-divided by ``div``): a spilled column is read a chunk at a
    time, its pages dropped once copied (sink.drop_pages)."""
    def read(a: int, b: int) -> np.ndarray:
        out = np.array(arr[a:b], dtype=np.int64)
        drop_pages(arr, a, b)
        return out // div if div > 1 else out
    return read


def detect_freq(minute: np.ndarray, sym: np.ndarray, n_sym: int, span: tuple[int, int] | None = None) -> str:
    """timeaxis.detect_freq, a chunk at a time when the bars come grouped (``span``: the first and last stamp,
    when known)."""
    try:
        values, counts, _ = _minute_gaps(minute, sym, n_sym, span=span)
    except NotGrouped:
        return timeaxis.detect_freq(np.asarray(minute, dtype=np.int64), np.asarray(sym))
    return timeaxis.freq_of_gaps(values, counts)


def finer_than(freq: str, minute: np.ndarray, sym: np.ndarray, n_sym: int, span: tuple[int, int] | None = None
               ) -> int | None:
    """timeaxis.finer_than, a chunk at a time when the bars come grouped."""
    if freq == timeaxis.DAILY or len(minute) < 2:
        return None
    try:
        return _minute_gaps(minute, sym, n_sym, timeaxis.minutes(freq), span)[2]
    except NotGrouped:
        return timeaxis.finer_than(freq, np.asarray(minute, dtype=np.int64), np.asarray(sym))


def _minute_gaps(minute: np.ndarray, sym: np.ndarray, n_sym: int, finer: int | None = None,
                 span: tuple[int, int] | None = None):
    n = len(minute)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), None
    lo, hi = span if span is not None else (int(np.min(minute)), int(np.max(minute)))
    day0 = lo // timeaxis.MINUTES_PER_DAY
    n_days = hi // timeaxis.MINUTES_PER_DAY - day0 + 1
    return minute_gaps(column(minute), column(sym), n, n_sym, day0, n_days, finer)
