"""Trading sessions of intraday stores: the bar stamps of a trading day, and the calendar they make.

An intraday calendar is either the union of the input's stamps, or every bar of a session template on every
trading date of the input: A-share (09:30-11:30 and 13:00-15:00, 240 one-minute bars a day), US equities
(09:30-16:00, 390), a 24-hour market, or sessions given in a file. A bar is stamped with its end (the A-share
and the usual vendor convention: 09:31 is the bar 09:30-09:31) or, with ``stamp="start"``, with its start (the
default of 24-hour markets, whose day then runs 00:00-23:59). With a template, a bar missing from a session is
NaN, as a suspension is in daily data, and a bar outside every session is an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from . import timeaxis
from ..errors import InputError

TEMPLATES: dict[str, tuple[tuple[str, str], ...]] = {
    "ashare": (("09:30", "11:30"), ("13:00", "15:00")),
    "us": (("09:30", "16:00"),),
    "24h": (("00:00", "24:00"),),
}
STAMPS = ("end", "start")


def _clock(text: str, where: str) -> int:
    try:
        hh, mm = str(text).strip().split(":")[:2]
        value = int(hh) * 60 + int(mm)
    except ValueError:
        raise InputError(f"{where}: {text!r} is not a time of day HH:MM") from None
    if not 0 <= value <= timeaxis.MINUTES_PER_DAY:
        raise InputError(f"{where}: {text!r} is not a time of day HH:MM")
    return value


@dataclass(frozen=True)
class Sessions:
    """The sessions of a trading day: ``(open, close)`` minutes of the day, and how bars are stamped."""

    name: str
    intervals: tuple[tuple[int, int], ...]
    stamp: str = "end"

    def day_stamps(self, freq: str) -> np.ndarray:
        """Minutes of the day of every bar of ``freq`` in the sessions (int64, increasing)."""
        step = timeaxis.minutes(freq)
        out = []
        for open_, close in self.intervals:
            if (close - open_) % step:
                raise InputError(f"sessions {self.name}: {_hhmm(open_)}-{_hhmm(close)} is not a whole number of "
                                 f"{freq} bars")
            ends = np.arange(open_ + step, close + 1, step)
            out.append(ends if self.stamp == "end" else ends - step)
        return np.concatenate(out).astype(np.int64)

    def as_dict(self) -> dict[str, Any]:
        """For the manifest: name, intervals as HH:MM pairs, stamp."""
        return {"name": self.name, "intervals": [[_hhmm(a), _hhmm(b)] for a, b in self.intervals],
                "stamp": self.stamp}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sessions:
        return cls(str(d["name"]), tuple((_clock(a, "sessions"), _clock(b, "sessions")) for a, b in d["intervals"]),
                   str(d.get("stamp", "end")))


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def load(spec: str | os.PathLike, stamp: str | None = None) -> Sessions:
    """A template by name (``ashare``, ``us``, ``24h``) or a CSV file of ``open,close`` rows (HH:MM).

    Raises:
        InputError: unknown template, unreadable file, sessions out of order or overlapping.
    """
    if stamp is not None and stamp not in STAMPS:
        raise InputError(f"--stamp {stamp!r}: expected one of {', '.join(STAMPS)}")
    name = str(spec)
    if name in TEMPLATES:
        intervals = tuple((_clock(a, name), _clock(b, name)) for a, b in TEMPLATES[name])
        default = "start" if name == "24h" else "end"
    else:
        path = Path(spec)
        if not path.is_file():
            raise InputError(f"--sessions {name!r}: not a template ({', '.join(TEMPLATES)}) nor a file")
        try:
            df = pl.read_csv(path, infer_schema_length=0, glob=False)
        except Exception as exc:   # polars raises many kinds; all mean "unreadable"
            raise InputError(f"{path}: cannot read sessions ({' '.join(str(exc).split())[:200]})") from None
        cols = {c.strip().lower(): c for c in df.columns}
        if not {"open", "close"} <= set(cols):
            raise InputError(f"{path}: a sessions file needs columns open,close (HH:MM); found {', '.join(df.columns)}")
        intervals = tuple((_clock(a, f"{path} line {i + 2}"), _clock(b, f"{path} line {i + 2}"))
                          for i, (a, b) in enumerate(zip(df[cols["open"]], df[cols["close"]])))
        default = "end"
    flat = [x for pair in intervals for x in pair]
    if not intervals or any(b <= a for a, b in zip(flat, flat[1:])):
        raise InputError(f"sessions {name}: sessions must be increasing and must not overlap")
    return Sessions(name, intervals, stamp or default)


def calendar(minute_keys: np.ndarray, sessions: Sessions, freq: str) -> np.ndarray:
    """Every session bar (minute keys) of every trading date on which the bars have a stamp, up to the last
    stamp: a day still trading ends at its latest bar, so the rest of it is appended at the tail later (cells
    laid out for bars not yet received would turn their arrival into revisions and a rewrite)."""
    keys = np.asarray(minute_keys, dtype=np.int64)
    if keys.size == 0:
        return keys
    days = np.unique(trading_day(keys, sessions.stamp == "end"))
    day_stamps = sessions.day_stamps(freq)
    cal = (days[:, None] * timeaxis.MINUTES_PER_DAY + day_stamps[None, :]).reshape(-1)
    return cal[cal <= keys.max()]


# A gap in a calendar longer than a bar plus this is a break between sessions; a shorter one is missing bars
# (no exchange has a lunch break under an hour, and a minute with no trade must not start a new session).
BREAK_MINUTES = 30


def trading_day(minute_keys: np.ndarray, end_stamped: bool = False) -> np.ndarray:
    """The date (days since 1970) each bar belongs to. A bar stamped with its end at midnight (24:00, the last
    bar of a 24-hour session) belongs to the day it ends, not to the next."""
    k = np.asarray(minute_keys, dtype=np.int64)
    return (k - 1) // timeaxis.MINUTES_PER_DAY if end_stamped else k // timeaxis.MINUTES_PER_DAY


def session_ids(minute_keys: np.ndarray, freq: str, end_stamped: bool = False) -> np.ndarray:
    """Session number of each stamp of a calendar: a new session starts on a new date or after a gap of more
    than a bar plus BREAK_MINUTES (the lunch break), never at a missing bar or two."""
    k = np.asarray(minute_keys, dtype=np.int64)
    if k.size == 0:
        return np.zeros(0, dtype=np.int64)
    day = trading_day(k, end_stamped)
    new = np.ones(len(k), dtype=bool)
    new[1:] = (np.diff(k) > timeaxis.minutes(freq) + BREAK_MINUTES) | (day[1:] != day[:-1])
    return np.cumsum(new) - 1
