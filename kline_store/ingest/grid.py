"""One bar size per store: each input file's and each symbol's bar size, and bars off the store's grid.

A store holds bars of one size. Its inputs are measured in one pass over the bars read (a chunk at a time when
they come grouped, bar_gaps.py): per file, the gaps in minutes between a symbol's consecutive bars of one day and the
bars at each time of day; per symbol of a file, its bars, its same-day pairs and the range of its times of day.

* A symbol of a file is **daily** when it has three bars or more, never two on one day, at one time of day (give or
  take DAILY_SPREAD minutes: a close stamped 14:59 or 15:00); **intraday** when it has two bars on one day.
* A file's intraday size is its smallest gap that is not rare (at least SHARE of its gaps): a thin symbol's
  1-minute bars have gaps of 2, 3, ... minutes but still many of 1; a 5-minute file with one bar at 16:02 still
  has 5 as its size. A file of daily symbols is daily (weekly/monthly are told apart later, barsize.py).
* A file holding daily and intraday symbols, or files of different sizes, are refused in one line naming two of
  them and their sizes; with ``--skip-bad`` the size most files have is kept and the others are listed.
* A bar whose time of day is off the grid of the store's size (its minute of the day modulo the size is one that
  fewer than PHASE_SHARE of the most common one's bars have: 16:02 in a 5-minute store) is refused naming its
  file, line and stamp; with ``--skip-bad`` dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import bar_gaps
from ..errors import InputError
from ..store import timeaxis
from .inputs import shown

PER_DAY = timeaxis.MINUTES_PER_DAY
MIN_GAPS = 3          # a file's intraday size is judged from at least this many same-day gaps
SHARE = 0.02          # a gap size holding fewer than this share of a file's gaps is not its bar size
PHASE_SHARE = 0.05    # a time of day (modulo the size) with fewer bars than this share of the most common: off grid
DAILY_SPREAD = 60     # a daily symbol's stamps may vary by this many minutes (14:59 or 15:00)
DAILY = timeaxis.DAILY


def describe(size: str) -> str:
    """A bar size for messages: "daily bars (1d)", "5-minute bars (5min)"."""
    if size == DAILY:
        return "daily bars (1d)"
    return f"{int(size[:-3])}-minute bars ({size})"


@dataclass
class Measure:
    """What one pass over the bars tells about their sizes."""

    hist: dict[int, np.ndarray]   # file -> counts of same-day gaps by minutes (index 0..1440)
    tod: dict[int, np.ndarray]    # file -> bars at each minute of the day (1440)
    gfile: np.ndarray             # per (file, symbol) group: its file,
    gsym: np.ndarray              # its symbol code,
    n_bars: np.ndarray            # its bars,
    pairs: np.ndarray             # its pairs of bars on one day at different stamps,
    spread: np.ndarray            # the minutes between its earliest and latest time of day

    def gaps(self, files) -> np.ndarray:
        out = np.zeros(PER_DAY + 1, dtype=np.int64)
        for f in files:
            if f in self.hist:
                out += self.hist[f]
        return out

    def times(self, files) -> np.ndarray:
        out = np.zeros(PER_DAY, dtype=np.int64)
        for f in files:
            if f in self.tod:
                out += self.tod[f]
        return out


def _add(store: dict[int, np.ndarray], keys: np.ndarray, vals: np.ndarray, width: int) -> None:
    """store[key] += counts of vals per key (files come one after the other: few keys per chunk)."""
    if not len(keys):
        return
    k0, k1 = int(keys.min()), int(keys.max())
    if k1 - k0 < 64:     # the usual case: one file, or a few, per chunk (no sort)
        counts = np.bincount((keys - k0) * width + vals, minlength=(k1 - k0 + 1) * width).reshape(-1, width)
        u = np.flatnonzero(counts.any(axis=1))
        counts, u = counts[u], u + k0
    else:
        u, inv = np.unique(keys, return_inverse=True)
        counts = np.bincount(inv * width + vals, minlength=len(u) * width).reshape(len(u), width)
    for k, row in zip(u.tolist(), counts):
        acc = store.get(k)
        if acc is None:
            store[k] = row.astype(np.int64)
        else:
            acc += row


def _add_one(store: dict[int, np.ndarray], vals: np.ndarray, width: int) -> None:
    """store[0] += counts of vals (one file)."""
    if len(vals):
        counts = np.bincount(vals, minlength=width)
        if 0 in store:
            store[0] += counts
        else:
            store[0] = counts.astype(np.int64)


def measure(bars) -> Measure:
    """One pass over the bars (a Bars of bars.py); grouped inputs a chunk at a time, others sorted first."""
    n, n_sym = len(bars), max(len(bars.names), 1)
    span = bars.span
    lo, hi = span if span is not None else ((int(np.min(bars.minute)), int(np.max(bars.minute))) if n else (0, 0))
    day0 = lo // PER_DAY
    n_days = hi // PER_DAY - day0 + 1
    cols = (bar_gaps.column(bars.file), bar_gaps.column(bars.sym), bar_gaps.column(bars.minute))
    try:
        return _measure(cols, n, n_sym, max(len(bars.files), 1), day0, n_days)
    except bar_gaps.NotGrouped:
        f, s, m = (np.asarray(c, dtype=np.int64) for c in (bars.file, bars.sym, bars.minute))
        order = np.lexsort((m, s, f))
        cols = tuple((lambda arr: (lambda a, b: arr[a:b]))(x[order]) for x in (f, s, m))
        return _measure(cols, n, n_sym, max(len(bars.files), 1), day0, n_days)


def _measure(cols, n: int, n_sym: int, n_files: int, day0: int, n_days: int) -> Measure:
    file, sym, minute = cols
    hist: dict[int, np.ndarray] = {}
    tod: dict[int, np.ndarray] = {}
    parts: list[tuple[np.ndarray, ...]] = []
    one = n_files == 1                               # the usual big input: one file, no file column to read
    last: list = [None, None]                        # the minutes read for group(), again for time()

    def times(a: int, b: int) -> np.ndarray:
        if last[0] != (a, b):
            last[0], last[1] = (a, b), minute(a, b)
        return last[1]

    def group(a: int, b: int) -> np.ndarray:
        key = sym(a, b) if one else file(a, b) * n_sym + sym(a, b)
        return key * n_days + (times(a, b) // PER_DAY - day0)

    first = True
    for c in bar_gaps.chunks(n, group, times, n_files * n_sym * n_days):
        s = 0 if first else 1                        # a chunk's first bar is the previous chunk's last
        first = False
        t = c.t[s:] % PER_DAY
        if not len(t):
            continue
        gaps = np.abs(c.d)                           # 0 between groups (and for a repeated stamp): not counted
        if one:
            _add_one(hist, gaps, PER_DAY + 1)
            _add_one(tod, t, PER_DAY)
        else:
            fs = c.group // n_days                   # file * n_sym + symbol of each bar
            ok = gaps > 0
            _add(hist, fs[1:][ok] // n_sym, gaps[ok], PER_DAY + 1)
            _add(tod, fs[s:] // n_sym, t, PER_DAY)
        # per (symbol, day) run of this chunk: bars, pairs (bars - 1, the pair across the chunk's start added)
        seg = np.flatnonzero(np.r_[True, ~c.same[s:]])
        nb = np.diff(np.r_[seg, len(t)])
        pairs = nb - 1
        if s and c.same[0]:
            pairs[0] += 1
        parts.append((c.group[s:][seg] // n_days, nb, pairs, np.minimum.reduceat(t, seg),
                      np.maximum.reduceat(t, seg)))
    for h in hist.values():
        h[0] = 0                                     # pairs of two groups, repeated stamps: no gap
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return Measure(hist, tod, z, z, z, z, z)
    keys, nb, pc, tlo, thi = (np.concatenate(p) for p in zip(*parts))
    u, inv = np.unique(keys, return_inverse=True)
    lo_t = np.full(len(u), PER_DAY, dtype=np.int64)
    hi_t = np.full(len(u), -1, dtype=np.int64)
    np.minimum.at(lo_t, inv, tlo)
    np.maximum.at(hi_t, inv, thi)
    return Measure(hist, tod, u // n_sym, u % n_sym, np.bincount(inv, weights=nb).astype(np.int64),
                   np.bincount(inv, weights=pc).astype(np.int64), hi_t - lo_t)


def gap_size(hist: np.ndarray) -> str | None:
    """A file's intraday size from its same-day gaps (see the module's docstring), None with too few gaps."""
    total = int(hist.sum())
    if total < MIN_GAPS:
        return None
    common = np.flatnonzero(hist >= max(2.0, SHARE * total))
    if not len(common):
        return None
    g = int(common[0])
    return f"{g}min" if g < PER_DAY and PER_DAY % g == 0 else None   # 119 minutes: two stamps, no bar size


@dataclass
class Sizes:
    """Each file's bar size (None: too few bars to tell) and the files holding daily and intraday symbols."""

    files: dict[int, str | None]
    mixed: dict[int, tuple[int, int]]    # file -> (a daily symbol, an intraday symbol)
    bars_of: dict[int, int]              # file -> bars


def sizes(m: Measure) -> Sizes:
    daily = (m.pairs == 0) & (m.n_bars >= MIN_GAPS) & (m.spread <= DAILY_SPREAD)
    intra = m.pairs > 0
    files: dict[int, str | None] = {}
    mixed: dict[int, tuple[int, int]] = {}
    bars_of: dict[int, int] = {}
    for f in np.unique(m.gfile).tolist():
        g = m.gfile == f
        bars_of[f] = int(m.n_bars[g].sum())
        d, i = g & daily, g & intra
        if d.any() and i.any():
            mixed[f] = (int(m.gsym[np.flatnonzero(d)[0]]), int(m.gsym[np.flatnonzero(i)[0]]))
            files[f] = gap_size(m.hist.get(f, np.zeros(1, np.int64)))
        elif i.any():
            files[f] = gap_size(m.hist[f])
        elif d.any():
            files[f] = DAILY
        else:
            files[f] = None
    return Sizes(files, mixed, bars_of)


def settle(bars, freq: str | None, skip_bad: bool) -> tuple[object, str | None]:
    """Check the bars of a new store (bars.Bars) for one bar size; returns (the bars kept, their intraday size or
    "1d", or None when no time of day is carried and the caller decides as before).

    ``freq``: the size given (``--freq``), canonical ("5min", "1d") or None.
    """
    if freq == DAILY or not bars.intraday and freq is None:   # --freq 1d: duplicate days name the bars
        return bars, None
    m = measure(bars)
    sz = sizes(m)
    drop_files: dict[int, str] = {}
    drop_groups: list[tuple[int, int]] = []
    for f, (a, b) in sz.mixed.items():
        size = sz.files[f] or "1min"
        if not skip_bad:
            raise InputError(f"{shown(bars.files[f])}: symbol {bars.names[a]} holds {describe(DAILY)} and symbol "
                             f"{bars.names[b]} {describe(size)}: a store has one bar size; ingest them into "
                             f"separate stores")
        # the daily symbols of a file of intraday ones go (their bars were not meant for this store)
        g = (m.gfile == f) & (m.pairs == 0) & (m.spread <= DAILY_SPREAD) & (m.n_bars >= MIN_GAPS)
        drop_groups += [(f, int(s)) for s in m.gsym[g]]
        bars.skipped.append((shown(bars.files[f]), f"{int(g.sum())} symbol(s) of {describe(DAILY)} left out "
                                                   f"(e.g. {bars.names[int(m.gsym[g][0])]}); the file's other "
                                                   f"symbols hold {describe(size)}"))
    known = {f: s for f, s in sz.files.items() if s is not None}
    given = freq
    kinds = sorted(set(known.values()), key=lambda s: timeaxis.minutes(s))
    if given is not None:
        other = [f for f, s in known.items() if s != given]
        coarser = [f for f in other if timeaxis.minutes(known[f]) > timeaxis.minutes(given)]   # finer: the line, below
        if coarser and not skip_bad:
            f = coarser[0]
            raise InputError(f"--freq {given}: {shown(bars.files[f])} holds {describe(known[f])}; a store has one "
                             f"bar size (leave --freq out, or ingest that file into another store)")
        for f in other if skip_bad else []:
            drop_files[f] = f"holds {describe(known[f])}; --freq {given}"
        keep = given
    elif len(kinds) > 1:
        votes = {k: (sum(1 for s in known.values() if s == k),
                     sum(sz.bars_of.get(f, 0) for f, s in known.items() if s == k)) for k in kinds}
        keep = max(kinds, key=lambda k: votes[k])
        if not skip_bad:
            a = next(f for f, s in known.items() if s == keep)
            b = next(f for f, s in known.items() if s != keep)
            raise InputError(f"{shown(bars.files[a])} holds {describe(keep)} and {shown(bars.files[b])} "
                             f"{describe(known[b])}: a store has one bar size; ingest them into separate stores "
                             f"(then `kline-store resample` the finer one), or pass --skip-bad to keep the "
                             f"{describe(keep)} (most files, most bars on a tie)")
        for f, s in known.items():
            if s != keep:
                drop_files[f] = f"holds {describe(s)}; the store takes the {describe(keep)} most files hold"
    else:
        keep = kinds[0] if kinds else None
    if drop_files or drop_groups:
        bars = drop(bars, drop_files, drop_groups)
        m = measure(bars)
    kept = [f for f in range(len(bars.files)) if f not in drop_files]
    if keep is None:       # no file says: the most common gap of all, as before
        gaps = m.gaps(kept)
        keep = timeaxis.freq_of_gaps(np.flatnonzero(gaps[1:]) + 1, gaps[1:][gaps[1:] > 0])
    if keep == DAILY:
        return bars, DAILY
    if PER_DAY % timeaxis.minutes(keep):
        raise InputError(f"bars are {describe(keep)}, which does not divide a day; pass --freq")
    bars = off_grid(bars, keep, m.times(kept), skip_bad)
    if m.gaps(kept)[1: timeaxis.minutes(keep)].any():   # bars closer than the size: find the first (a pass)
        i = bar_gaps.finer_than(keep, bars.minute, bars.sym, len(bars.names), bars.span)
        if i is not None:
            said = f"--freq {given}: " if given else ""
            raise InputError(f"{bars.where(i)}: {said}bar at {timeaxis.show(int(bars.minute[i]), 'm')} is less than "
                             f"{keep} after the symbol's previous bar: the bars are finer (leave --freq out, then "
                             f"resample "
                             f"the store)" if given else
                             f"{bars.where(i)}: bar at {timeaxis.show(int(bars.minute[i]), 'm')} is less than {keep} "
                             f"after the symbol's previous bar, in a file of {describe(keep)}")
    return bars, keep


def drop(bars, files: dict[int, str], groups: list[tuple[int, int]]):
    """The bars without the files (and file symbols) left out; the files listed as skipped."""
    f = np.asarray(bars.file, dtype=np.int64)
    keep = ~np.isin(f, np.asarray(list(files), dtype=np.int64))
    if groups:
        key = f * len(bars.names) + np.asarray(bars.sym, dtype=np.int64)
        keep &= ~np.isin(key, np.asarray([a * len(bars.names) + b for a, b in groups], dtype=np.int64))
    for i, why in files.items():
        bars.skipped.append((shown(bars.files[i]), why))
    gone = {shown(bars.files[i]) for i in files}
    out = bars.subset(keep)
    used = np.unique(np.asarray(out.sym))
    if len(used) < len(bars.names):   # symbols with no bar left: out of the store
        code = np.zeros(len(bars.names), dtype=np.uint32)
        code[used] = np.arange(len(used), dtype=np.uint32)
        out.names, out.sym = [bars.names[i] for i in used.tolist()], code[np.asarray(out.sym)]
    out.sources = [s for s in bars.sources if s.get("path") not in gone]
    out.notes = list(bars.notes)
    if not len(out):
        raise InputError(f"no bars left after leaving out files of other bar sizes: {bars.skipped[0][0]}: "
                         f"{bars.skipped[0][1]}")
    return out


def grid_phases(times: np.ndarray, size: str) -> np.ndarray:
    """Which minutes of the day modulo ``size`` are on the grid, given the bars at each minute of the day."""
    k = timeaxis.minutes(size)
    phase = times.reshape(PER_DAY // k, k).sum(axis=0)
    return phase >= max(1.0, PHASE_SHARE * phase.max())


def off_grid(bars, size: str, times: np.ndarray, skip_bad: bool, on: np.ndarray | None = None,
             where: str | None = None):
    """Bars whose time of day is off the grid: an error naming the first, or (``skip_bad``) dropped and counted
    in a note. ``on``: the grid's phases (else from ``times``, the bars at each minute of the day)."""
    k = timeaxis.minutes(size)
    if k <= 1:
        return bars
    on = grid_phases(times, size) if on is None else on
    if (times.reshape(PER_DAY // k, k).sum(axis=0)[~on] == 0).all():
        return bars
    col = bar_gaps.column(bars.minute)
    off = []
    for a in range(0, len(bars), bar_gaps.STEP):
        t = col(a, min(a + bar_gaps.STEP, len(bars)))
        off.append(np.flatnonzero(~on[(t % PER_DAY) % k]) + a)
    idx = np.concatenate(off)
    if not len(idx):
        return bars
    i = int(idx[0])
    grid = f"minute of the day mod {k} = {', '.join(str(p) for p in np.flatnonzero(on)[:4])}"
    stamp = timeaxis.show(int(bars.minute[i]), "m")
    what = where or f"a {size} store"
    if not skip_bad:
        raise InputError(f"{bars.where(i)}: bar at {stamp} ({bars.names[int(bars.sym[i])]}) is off the grid of "
                         f"{what} ({grid}); {len(idx)} such bar(s) in all; fix "
                         f"the file, or pass --skip-bad to leave them out")
    keep = np.ones(len(bars), dtype=bool)
    keep[idx] = False
    out = bars.subset(keep)
    out.sources, out.notes = bars.sources, list(bars.notes)
    out.notes.append(f"left out {len(idx)} bar(s) off the grid of {what} (--skip-bad), first {bars.where(i)} at "
                     f"{stamp}")
    return out


def store_phases(manifest: dict) -> tuple[str, np.ndarray] | None:
    """An intraday store's size and the phases of its calendar's stamps (its grid), or None for a daily one."""
    freq = manifest.get("freq", DAILY)
    if freq == DAILY:
        return None
    k = timeaxis.minutes(freq)
    cal = np.asarray(manifest.get("calendar", []), dtype="datetime64[m]").astype(np.int64)
    on = np.zeros(k, dtype=bool)
    on[np.unique((cal % PER_DAY) % k)] = True
    return freq, on


def check_append(manifest: dict, bars, store: Path, skip_bad: bool):
    """Bars appended to an intraday store are of its size and on its grid: one line naming both sizes (or the
    off-grid bar), before anything is written; returns the bars (off-grid ones dropped with ``skip_bad``)."""
    got = store_phases(manifest)
    if got is None or not len(bars):
        return bars
    size, on = got
    m = measure(bars)
    sz = sizes(m)
    for f, s in sz.files.items():
        if f in sz.mixed:
            s = DAILY
        if s is not None and s != size:
            raise InputError(f"{shown(bars.files[f])} holds {describe(s)}; {store} is a store of {describe(size)}: "
                             f"append bars of its size, or ingest these into another store")
    files = range(len(bars.files))
    if not skip_bad and m.gaps(files)[1: timeaxis.minutes(size)].any():
        return bars   # bars closer than the store's: refused as finer, naming the line (update.plan_append)
    return off_grid(bars, size, m.times(files), skip_bad, on=on, where=f"{store} ({size})")
