"""Bars longer than a day: weekly (``1w``) and monthly (``1mo``) bars on a calendar of dates.

Such a store's time axis is daily (``freq`` "1d": one calendar entry per bar date) and its manifest says how long
a bar is (``bar``: "1d", "1w" or "1mo"), so windows, horizons and embargoes count weekly or monthly bars. The bar
size of an input is detected from its dates (the median gap between a symbol's consecutive bars: up to 4 days a
daily bar, 5 to 10 a week, 20 to 45 a month) or stated (``--freq 1w``); a store takes bars of one size only.

``resample_days``: weekly or monthly bars from a daily store. A week (Monday to Sunday) or a month ends on its
last trading day in the store's calendar, which stamps it: open the first, high the max, low the min, close the
last, volume, amount and turnover the sum, ``pre_close`` the first, other fields the last (pandas' ``resample("W")``
/ ``resample("M")`` with first/max/min/last/sum over the same bars, labelled by the last trading day).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import bar_gaps
from ..errors import InputError
from ..store import identity, timeaxis
from ..store.snapshot import Store, open_store
from ..store import create_store

DAY, WEEK, MONTH = "1d", "1w", "1mo"
NAMES = {DAY: "daily", WEEK: "weekly", MONTH: "monthly"}
_LONG = re.compile(r"^\s*1?\s*(w|wk|week|weeks|weekly|mo|mon|month|months|monthly)\s*$", re.IGNORECASE)
FIRST = frozenset({"open", "pre_close"})
SUM = frozenset({"volume", "amount", "turnover"})


def parse(text: str | None) -> str | None:
    """"1w" or "1mo" for a weekly or monthly ``--freq`` (``1w``, ``W``, ``week``, ``1mo``, ``month``, ...), else
    None (a daily or intraday size, for timeaxis.parse_freq)."""
    if text is None:
        return None
    m = _LONG.match(str(text))
    if not m:
        return None
    return WEEK if m.group(1).lower().startswith("w") else MONTH


def classify(median_gap_days: float) -> str:
    if median_gap_days <= 4:
        return DAY
    if median_gap_days <= 10:
        return WEEK
    if median_gap_days <= 45:
        return MONTH
    return DAY   # quarterly or irregular: kept as dated bars, no claim made


# Gaps above CLIP days count as CLIP: classify tells up to 4, 10, 45 days and beyond, and a median of gaps clipped
# at 2 x 45 + 1 falls in the same class as the exact one (an average of two middle gaps included).
CLIP = 91


# gap in days -> class: up to 4 a daily bar's, 5 to 10 a week's, 11 to 45 a month's, beyond irregular (daily)
CLASSES = np.digitize(np.arange(CLIP + 1), [5, 11, 46])
CLASS_KIND = (DAY, WEEK, MONTH, DAY)


def by_file(days: np.ndarray, sym: np.ndarray, file: np.ndarray, min_gaps: int = 1, per_day: int = 1,
            counts: tuple[int, int] | None = None, per_symbol: list | None = None) -> dict[int, str]:
    """The bar size of each input file that has at least ``min_gaps`` gaps between bars of one symbol (file
    index -> "1d"/"1w"/"1mo"). ``days``: each bar's day, or its stamp in ``1 / per_day`` days (minutes with
    1440). Grouped bars are read a chunk at a time (bar_gaps.py); others are sorted. ``per_symbol``: a list that
    receives each symbol's gaps by class (bar_gaps.SymbolGaps; grouped bars only)."""
    n = len(days)
    if n < 2:
        return {}
    n_sym, n_files = counts or (int(np.max(sym)) + 1, int(np.max(file)) + 1)   # (symbols, files) when known
    try:
        hist, week, month = bar_gaps.day_gaps(bar_gaps.column(days, per_day), bar_gaps.column(sym),
                                              bar_gaps.column(file), n, n_sym, n_files, CLIP,
                                              CLASSES if per_symbol is not None else None,
                                          per_symbol)
    except bar_gaps.NotGrouped:
        return _by_file_sorted(np.asarray(days, dtype=np.int64) // per_day, sym, file, min_gaps)
    out: dict[int, str] = {}
    for f in np.flatnonzero(hist.sum(axis=1) >= max(min_gaps, 1)).tolist():
        kind = classify(bar_gaps.median(hist[f]))
        if (kind == WEEK and week[f]) or (kind == MONTH and month[f]):
            kind = DAY
        out[f] = kind
    return out


def _by_file_sorted(days: np.ndarray, sym: np.ndarray, file: np.ndarray, min_gaps: int) -> dict[int, str]:
    """by_file over every bar sorted by file, symbol and day (the reference; memory proportional to the bars)."""
    sym = np.asarray(sym, dtype=np.int64)
    file = np.asarray(file, dtype=np.int64)
    order = np.lexsort((days, sym, file))
    d, s, f = days[order], sym[order], file[order]
    same = (s[1:] == s[:-1]) & (f[1:] == f[:-1])
    gaps, gf = (d[1:] - d[:-1])[same], f[1:][same]
    # Two bars of a symbol in one week (month) are never weekly (monthly) bars: a thinly traded daily symbol
    # with long gaps stays daily.
    week = ((d + 3) // 7)
    month = d.astype("datetime64[D]").astype("datetime64[M]").astype(np.int64)
    same_week = (week[1:] == week[:-1])[same]
    same_month = (month[1:] == month[:-1])[same]
    out: dict[int, str] = {}
    if not len(gaps):
        return out
    o = np.argsort(gf, kind="stable")
    gaps, gf, same_week, same_month = gaps[o], gf[o], same_week[o], same_month[o]
    cut = np.flatnonzero(np.r_[True, gf[1:] != gf[:-1], True])
    for a, b in zip(cut[:-1], cut[1:]):
        if b - a < min_gaps:
            continue
        kind = classify(float(np.median(gaps[a:b])))
        if (kind == WEEK and same_week[a:b].any()) or (kind == MONTH and same_month[a:b].any()):
            kind = DAY
        out[int(gf[a])] = kind
    return out


def detect(bars, stated: str | None) -> str:
    """The bar size of daily-axis bars (a Bars of bars.py): one size for every file; InputError naming two files
    of different sizes, or a stated size the dates contradict."""
    return settle(bars, stated, False)[1]


def symbol_kinds(gaps: bar_gaps.SymbolGaps, min_gaps: int = 3) -> dict[int, str]:
    """Each symbol's size (daily, weekly, monthly) from its gaps by class: the class of its median gap (the lower
    middle one), weekly or monthly only without two bars in one week or month; symbols of fewer gaps: none."""
    total = gaps.counts.sum(axis=1)
    judged = np.flatnonzero(total >= min_gaps)
    if not len(judged):
        return {}
    cum = np.cumsum(gaps.counts[judged], axis=1)
    cls = (cum <= ((total[judged] - 1) // 2)[:, None]).sum(axis=1)
    out = {}
    for s, c in zip(judged.tolist(), cls.tolist()):
        kind = CLASS_KIND[c]
        if (kind == WEEK and gaps.week[s]) or (kind == MONTH and gaps.month[s]):
            kind = DAY
        out[s] = kind
    return out


def settle(bars, stated: str | None, skip_bad: bool):
    """:func:`detect` per file and per symbol; with ``skip_bad`` the size most files (then symbols) have is kept
    and the others left out and listed (grid.drop). Returns (the bars kept, their size)."""
    from .grid import drop      # one layer below: the same leaving out as the intraday sizes

    per: list = []
    sizes = by_file(bars.minute, bars.sym, bars.file, per_day=timeaxis.MINUTES_PER_DAY,
                    counts=(len(bars.names), len(bars.files)), per_symbol=per)
    kinds = sorted(set(sizes.values()), key=[DAY, WEEK, MONTH].index)
    if len(kinds) > 1 and skip_bad:
        keep = max(kinds, key=lambda k: sum(1 for v in sizes.values() if v == k))
        bars = drop(bars, {f: f"holds {NAMES[k]} bars ({k}); the store takes the {NAMES[keep]} bars ({keep}) most "
                              f"files hold" for f, k in sizes.items() if k != keep}, [])
        sizes, kinds, per = {f: k for f, k in sizes.items() if k == keep}, [keep], []
    if len(kinds) > 1:
        a = next(i for i, k in sizes.items() if k == kinds[0])
        b = next(i for i, k in sizes.items() if k == kinds[1])
        raise InputError(f"{bars.files[a]} holds {NAMES[kinds[0]]} bars ({kinds[0]}) and {bars.files[b]} "
                         f"{NAMES[kinds[1]]} bars ({kinds[1]}): a store has one bar size; ingest them into separate "
                         f"stores (or `kline-store resample STORE --freq {kinds[1]}` the finer one)")
    found = kinds[0] if kinds else None
    by_sym = symbol_kinds(per[0]) if per and len(bars.names) > 1 else {}
    if found is not None and len(set(by_sym.values())) > 1:   # a long file of daily and weekly symbols
        other = {s: k for s, k in by_sym.items() if k != found}
        same = next((s for s, k in by_sym.items() if k == found), None)
        if not skip_bad and same is not None:
            a, b = same, next(iter(other))
            raise InputError(f"{_file_of(bars, b)}: symbol {bars.names[b]} holds {NAMES[other[b]]} bars ({other[b]}) "
                             f"and symbol {bars.names[a]} {NAMES[found]} bars ({found}): a store has one bar size; "
                             f"ingest them into separate stores")
        if same is not None:
            shown_names = [f"{bars.names[s]} ({k})" for s, k in other.items()]
            bars = drop(bars, {}, [(f, s) for s in other for f in range(len(bars.files))])
            bars.skipped.append(("symbols", f"{len(other)} symbol(s) of another bar size than the {NAMES[found]} "
                                            f"bars ({found}) left out: {', '.join(shown_names[:5])}"
                                            f"{' ...' if len(other) > 5 else ''}"))
    if stated is not None and found is not None and found != stated:
        f = bars.files[next(iter(sizes))]
        raise InputError(f"--freq {stated}: the dates of {f} are {NAMES[found]} bars ({found}); leave --freq out, "
                         f"or resample a daily store")
    return bars, stated or found or DAY


def _file_of(bars, s: int) -> str:
    """The file of a symbol's first bar (for a message)."""
    i = int(np.flatnonzero(np.asarray(bars.sym) == s)[0])
    return str(bars.files[int(bars.file[i])])


def check_append(manifest: dict, bars, store: Path) -> None:
    """An append brings bars of the store's own size; one line naming both sizes otherwise."""
    if manifest.get("freq", timeaxis.DAILY) != timeaxis.DAILY:
        return
    have = manifest.get("bar", DAY)
    # An append of a few days says little about its bar size (days 1 and 7 of a symbol: a gap of 6): a file is
    # judged by at least three gaps.
    sizes = by_file(bars.minute, bars.sym, bars.file, min_gaps=3, per_day=timeaxis.MINUTES_PER_DAY,
                    counts=(len(bars.names), len(bars.files)))
    for i, k in sizes.items():
        if k != have:
            raise InputError(f"{bars.files[i]} holds {NAMES[k]} bars ({k}); {store} is a store of {NAMES[have]} "
                             f"bars ({have}): append bars of its size, or ingest these into another store")


def period_ends(dates: np.ndarray, bar: str) -> np.ndarray:
    """Index into ``dates`` (sorted days) of the first date of each week or month: the periods' starts."""
    d = np.asarray(dates).astype("datetime64[D]")
    if bar == WEEK:
        key = (d.astype(np.int64) + 3) // 7          # weeks from Monday to Sunday (1970-01-01 was a Thursday)
    else:
        key = d.astype("datetime64[M]").astype(np.int64)
    return np.flatnonzero(np.r_[True, key[1:] != key[:-1]]).astype(np.int64)


def aggregate(block: np.ndarray, starts: np.ndarray, fields: list[str]) -> np.ndarray:
    """``block`` [symbols, days, fields] over the periods beginning at ``starts``, skipping missing days."""
    n_sym, n, nf = block.shape
    out = np.full((n_sym, len(starts), nf), np.nan, dtype=np.float32)
    pos = np.arange(n, dtype=np.int64)
    rows = np.arange(n_sym)[:, None]
    for j, name in enumerate(fields):
        v = block[:, :, j]
        ok = np.isfinite(v)
        if name == "high":
            out[:, :, j] = np.fmax.reduceat(v, starts, axis=1)
        elif name == "low":
            out[:, :, j] = np.fmin.reduceat(v, starts, axis=1)
        elif name in SUM:
            total = np.add.reduceat(np.where(ok, v, 0).astype(np.float64), starts, axis=1)
            count = np.add.reduceat(ok, starts, axis=1)
            out[:, :, j] = np.where(count > 0, total, np.nan)
        else:
            at = (np.minimum.reduceat(np.where(ok, pos, n), starts, axis=1) if name in FIRST
                  else np.maximum.reduceat(np.where(ok, pos, -1), starts, axis=1))
            have = (at >= 0) & (at < n)
            out[:, :, j] = np.where(have, v[rows, np.clip(at, 0, n - 1)], np.nan)
    return out


def resample_days(store: str | os.PathLike | Store, out: str | os.PathLike, bar: str, *, wait: float = 0.0,
                  replace: bool = False):
    """Weekly or monthly bars at ``out`` from a daily store (see the module's docstring)."""
    st = store if isinstance(store, Store) else open_store(store)
    have = st.manifest.get("bar", DAY)
    if st.freq != timeaxis.DAILY:
        raise InputError(f"{st.path}: {st.freq} bars; resample it to 1d first (`kline-store resample --freq 1d`), "
                         f"then that store to {bar}")
    order = [DAY, WEEK, MONTH]
    if order.index(bar) <= order.index(have):
        raise InputError(f"--freq {bar}: not coarser than the store's {have} bars")
    out = Path(out)
    if (out / "manifest.json").exists() and not replace:
        raise InputError(f"{out}: a store is already there; pass --replace to rebuild it")
    starts = period_ends(st.dates, bar)
    ends = np.r_[starts[1:], st.n_dates] - 1
    fields = list(st.fields)
    panel = np.empty((st.n_symbols, len(starts), len(fields)), dtype=np.float32)
    rows = max(1, (64 << 20) // max(1, st.n_dates * st.n_fields * 4))
    for lo in range(0, st.n_symbols, rows):
        panel[lo: lo + rows] = aggregate(np.asarray(st.panel[lo: lo + rows]), starts, fields)
    extra = {"bar": bar, "calendar_source": f"resampled from {st.path} ({have})",
             **{k: st.manifest.get(k) for k in ("adj_factor_source", "adj_last_factor", "adj_rebase")}}
    create_store(out, panel, st.symbols, st.dates[ends], fields, extra=extra, wait=wait,
                 sources=[{**identity.summary(st), "freq": have}])
    return Resampled(out, have, bar, st.n_symbols, st.n_dates, len(starts))


@dataclass
class Resampled:
    """What a weekly or monthly resample wrote (the fields of resample.ResampleReport)."""

    store: Path
    source_freq: str
    freq: str
    n_symbols: int
    n_bars_in: int
    n_periods: int

    def lines(self) -> list[str]:
        return [f"store {self.store}: {self.n_symbols} symbols, {self.n_periods} {NAMES[self.freq]} bars "
                f"({self.freq}) from {self.n_bars_in} {NAMES.get(self.source_freq, self.source_freq)} bar dates"]
