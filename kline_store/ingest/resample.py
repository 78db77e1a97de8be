"""Resample an intraday store into a coarser one: 5, 15, 30, 60 minutes or daily bars, exactly.

Each coarser bar aggregates the bars of its period within one session: open the first, high the max, low the
min, close the last, volume, amount and turnover the sum, ``adj_factor`` the last and ``pre_close`` the first
(other fields: the last). Only bars that exist count; a period with no bar of a symbol is NaN, as a suspension
is. Periods are aligned to each session's open (the A-share hour bars end at 10:30, 11:30, 14:00 and 15:00),
and a daily bar takes every bar of its trading date. Stamps follow the source: a period is stamped with its end,
the last one of a session at the session's close (90 minutes of A-share bars end at 11:00, 11:30, 14:30, 15:00),
or with its start for stores whose bars are stamped with their start. A size longer than every session is refused
(``1d`` makes day bars): no period spans a break or a night.

    source calendar -> period of each bar (sessions, open, offset) -> per block of symbols: reduceat -> new store
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import barsize
from ..store import identity, safefs, sessions as store_sessions, timeaxis
from ..errors import InputError
from ..store.snapshot import Store, open_store
from ..store import create_store

FIRST = frozenset({"open", "pre_close"})
MAX = frozenset({"high"})
MIN = frozenset({"low"})
SUM = frozenset({"volume", "amount", "turnover"})
BLOCK_BYTES = 64 << 20   # source cells aggregated at a time: bounded memory whatever the store's size


@dataclass(frozen=True)
class Periods:
    """Where each source bar goes: ``starts`` (first source bar of each period) and the periods' stamps."""

    starts: np.ndarray      # int64 [n_periods], increasing, starts[0] == 0
    keys: np.ndarray        # int64 [n_periods] keys of the target calendar (days or minutes)


def periods(src_keys: np.ndarray, src_freq: str, freq: str, sessions: store_sessions.Sessions | None = None,
            stamp: str | None = None) -> Periods:
    """Group a source calendar's bars into periods of ``freq`` (pure: calendars in, index arrays out).

    Args:
        src_keys: the source calendar, minutes since 1970 (sorted).
        src_freq: its bar size.
        freq: the target bar size ("1d", or minutes that are a multiple of the source's).
        sessions: the source's session template (its opens and its stamp convention), if it has one.
        stamp: "start" or "end": how the source's bars are stamped (default: the template's, else "end").
    """
    keys = np.asarray(src_keys, dtype=np.int64)
    midnight_end = sessions is not None and sessions.stamp == "end"   # a 24:00 bar ends its own day
    day = store_sessions.trading_day(keys, midnight_end)
    if freq == timeaxis.DAILY:
        period_key = day
    else:
        step, k = timeaxis.minutes(src_freq), timeaxis.minutes(freq)
        stamp_end = stamp == "end" if stamp is not None else (sessions is None or sessions.stamp == "end")
        sid = store_sessions.session_ids(keys, src_freq, midnight_end)
        first = np.flatnonzero(np.r_[True, np.diff(sid) != 0])              # first bar of each session
        clock = keys - day * timeaxis.MINUTES_PER_DAY                              # 1..1440 for a 24:00 bar
        opens = _session_opens(clock[first], day[first], sessions, step, stamp_end)
        last = np.r_[first[1:], len(keys)] - 1                               # last bar of each session
        closes = _session_closes(opens, clock[last] + (0 if stamp_end else step), sessions)
        if k > int((closes - opens).max()):
            raise InputError(f"--freq {freq} is longer than the longest session ({int((closes - opens).max())} "
                             f"minutes): a bar would span a break or the night; use --freq 1d for one bar a day")
        sizes = np.diff(np.r_[first, len(keys)])
        open_, close_ = np.repeat(opens, sizes), np.repeat(closes, sizes)
        offset = clock - open_
        if stamp_end:        # the bar ending at open + 1 .. open + k belongs to the period ending at open + k,
            stamp = np.minimum(open_ + ((offset - 1) // k + 1) * k, close_)   # the last one at the close
        else:                # the bar starting at open .. open + k - 1 to the period starting at open
            stamp = open_ + (offset // k) * k
        period_key = day * timeaxis.MINUTES_PER_DAY + stamp
    change = np.r_[True, np.diff(period_key) != 0]
    return Periods(np.flatnonzero(change).astype(np.int64), period_key[change])


def _session_closes(opens: np.ndarray, ends: np.ndarray, sessions: store_sessions.Sessions | None) -> np.ndarray:
    """The close (minute of day) of each session: its template session's, or without a template the latest end
    of a bar among the sessions with the same open (the usual close, the same on every day)."""
    if sessions is not None:
        opens_of = np.array([a for a, _ in sessions.intervals], dtype=np.int64)
        closes_of = np.array([b for _, b in sessions.intervals], dtype=np.int64)
        at = np.searchsorted(opens_of, opens, side="right") - 1
        return np.where(at >= 0, np.maximum(closes_of[np.maximum(at, 0)], ends), ends)
    kinds, inverse = np.unique(opens, return_inverse=True)
    latest = np.full(len(kinds), -1, dtype=np.int64)
    np.maximum.at(latest, inverse, ends)
    return latest[inverse]


def _session_opens(first_clock: np.ndarray, first_day: np.ndarray, sessions: store_sessions.Sessions | None, step: int,
                   stamp_end: bool) -> np.ndarray:
    """The open (minute of day) of each session of the calendar.

    With a template: the open of the template's session that holds the session's first bar. Without one, the
    opens are learnt from the data. First bars within an hour of each other are one kind of session (the
    morning's, the afternoon's); its open is their most common time (the earliest among ties), and a session of
    that kind starting later (its first minutes missing that day) keeps it, while one starting earlier is its
    own open. A kind seen on fewer than a quarter of the days (a session restarting after a long halt) is not an
    open: such a session keeps the latest usual open before it, so its periods stay on the day's grid.
    """
    guess = first_clock - (step if stamp_end else 0)
    if sessions is not None:
        opens_of = np.array([a for a, _ in sessions.intervals], dtype=np.int64)
        at = np.searchsorted(opens_of, guess, side="right") - 1
        return np.where(at >= 0, opens_of[np.maximum(at, 0)], guess)
    values, inverse, counts = np.unique(guess, return_inverse=True, return_counts=True)
    kind = np.cumsum(np.r_[True, np.diff(values) >= 60]) - 1            # kind of each distinct first time
    n_kinds = int(kind[-1]) + 1
    usual = np.empty(n_kinds, dtype=np.int64)
    for c in range(n_kinds):
        mine = np.flatnonzero(kind == c)
        usual[c] = values[mine[np.argmax(counts[mine])]]                 # argmax: the earliest among ties
    days_of_kind = np.array([len(np.unique(first_day[kind[inverse] == c])) for c in range(n_kinds)])
    real = days_of_kind * 4 >= max(1, len(np.unique(first_day)))
    own = usual[kind[inverse]]
    out = np.where(guess >= own, own, guess)
    real_opens = usual[real]
    at = np.searchsorted(real_opens, guess, side="right") - 1            # for sessions of a rare kind
    fallback = np.where(at >= 0, real_opens[np.maximum(at, 0)], guess)
    return np.where(real[kind[inverse]], out, fallback)


def aggregate(block: np.ndarray, starts: np.ndarray, fields: list[str]) -> np.ndarray:
    """Aggregate ``block`` [symbols, bars, fields] over the periods beginning at ``starts`` (NaN-aware)."""
    n_sym, n, nf = block.shape
    out = np.full((n_sym, len(starts), nf), np.nan, dtype=np.float32)
    pos = np.arange(n, dtype=np.int64)
    for j, name in enumerate(fields):
        v = block[:, :, j]
        ok = np.isfinite(v)
        if name in MAX:
            out[:, :, j] = np.fmax.reduceat(v, starts, axis=1)
        elif name in MIN:
            out[:, :, j] = np.fmin.reduceat(v, starts, axis=1)
        elif name in SUM:
            total = np.add.reduceat(np.where(ok, v, 0).astype(np.float64), starts, axis=1)
            count = np.add.reduceat(ok, starts, axis=1)
            out[:, :, j] = np.where(count > 0, total, np.nan)
        else:
            if name in FIRST:
                at = np.minimum.reduceat(np.where(ok, pos, n), starts, axis=1)
            else:
                at = np.maximum.reduceat(np.where(ok, pos, -1), starts, axis=1)
            have = (at >= 0) & (at < n)
            rows = np.arange(n_sym)[:, None]
            out[:, :, j] = np.where(have, v[rows, np.clip(at, 0, n - 1)], np.nan)
    return out


@dataclass
class ResampleReport:
    """What a resample wrote."""

    store: Path
    source_freq: str
    freq: str
    n_symbols: int
    n_bars_in: int
    n_periods: int

    def lines(self) -> list[str]:
        return [f"store {self.store}: {self.n_symbols} symbols, {self.n_periods} {self.freq} bar times from "
                f"{self.n_bars_in} {self.source_freq} bar times"]


def resample(store: str | os.PathLike | Store, out: str | os.PathLike, freq: str, *, wait: float = 0.0,
             replace: bool = False, stamp: str | None = None) -> ResampleReport:
    """Write a coarser store at ``out`` from an intraday store.

    ``stamp``: "start" or "end", how the store's bars are stamped (and so the new ones: a 5-minute period of
    start-stamped bars is labelled by its first minute, 16:00 for 16:00..16:04); default the store's own (its
    session template's, else what an earlier resample recorded, else "end").

    Raises:
        InputError: a daily source, a target not coarser or not a multiple of the source's bar size, an existing
            store at ``out`` without ``replace``.
    """
    st = store if isinstance(store, Store) else open_store(store)
    safefs.outside_store(st.path, out)
    if barsize.parse(freq) is not None:   # weekly or monthly bars from a daily store: barsize.py
        return barsize.resample_days(st, out, barsize.parse(freq), wait=wait, replace=replace)  # type: ignore
    target = timeaxis.parse_freq(freq)
    if st.freq == timeaxis.DAILY:
        raise InputError(f"{st.path}: a daily store; resample makes coarser bars of an intraday store, and weekly "
                         f"or monthly bars of a daily one (--freq 1w, --freq 1mo)")
    src_min = timeaxis.minutes(st.freq)
    if timeaxis.minutes(target) <= src_min:
        raise InputError(f"--freq {target}: not coarser than the store's {st.freq} bars; choose a coarser size")
    if target != timeaxis.DAILY and timeaxis.minutes(target) % src_min:
        raise InputError(f"--freq {target}: not a multiple of the store's {st.freq} bars; choose a coarser size "
                         f"that {st.freq} divides")
    out = Path(out)
    if (out / "manifest.json").exists() and not replace:
        raise InputError(f"{out}: a store is already there; pass --replace to rebuild it")
    sess = st.manifest.get("sessions")
    template = store_sessions.Sessions.from_dict(sess) if sess else None
    own = template.stamp if template is not None else st.manifest.get("stamp")
    if stamp is not None and stamp not in ("start", "end"):
        raise InputError(f"--stamp {stamp!r}: expected start or end")
    if stamp is not None and template is not None and stamp != own:
        raise InputError(f"--stamp {stamp}: {st.path}'s session template stamps its bars with their {own}; leave "
                         f"--stamp out")
    stamp = stamp or own or "end"
    per = periods(st.dates.astype(np.int64), st.freq, target, template, stamp)
    fields = list(st.fields)
    panel = np.empty((st.n_symbols, len(per.starts), len(fields)), dtype=np.float32)
    rows = max(1, BLOCK_BYTES // max(1, st.n_dates * st.n_fields * 4))
    for lo in range(0, st.n_symbols, rows):
        panel[lo: lo + rows] = aggregate(np.asarray(st.panel[lo: lo + rows]), per.starts, fields)
    keep_sessions = template is not None and target != timeaxis.DAILY and \
        all((b - a) % timeaxis.minutes(target) == 0 for a, b in template.intervals)
    extra = {"calendar_source": f"resampled from {st.path} ({st.freq})",
             "sessions": template.as_dict() if keep_sessions else None,
             "timezone": st.manifest.get("timezone") or "exchange-local, naive",
             **({"stamp": stamp} if template is None and target != timeaxis.DAILY else {}),
             **{k: st.manifest.get(k) for k in ("adj_factor_source", "adj_last_factor", "adj_rebase")}}
    create_store(out, panel, st.symbols, timeaxis.stamps(per.keys, timeaxis.unit(target)), fields, extra=extra,
                 wait=wait, freq=target, sources=[{**identity.summary(st), "freq": st.freq}])
    return ResampleReport(out, st.freq, target, st.n_symbols, st.n_dates, len(per.starts))
