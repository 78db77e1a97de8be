"""The store's time axis: daily dates or intraday bar stamps, as integer keys, stamps and ISO text.

A store has one bar size (its ``freq``): ``"1d"`` for daily bars, ``"<N>min"`` for intraday bars of N minutes
(1 to 60, or any fixed size). Times are exchange-local and naive (no time zone): a daily bar is its trading date,
an intraday bar its stamp as the vendor wrote it (the A-share convention stamps a bar with its end: 09:31 is
09:30-09:31). Keys are integers since 1970-01-01 in the store's unit: days (``"D"``) for daily stores, minutes
(``"m"``) for intraday ones; the calendar is a sorted array of keys, and ``Store.dates`` the same as
``datetime64[D]`` or ``datetime64[m]``.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import InputError

DAILY = "1d"
MINUTES_PER_DAY = 1440
_FREQ = re.compile(r"^\s*(\d+)\s*(min|m|minute|minutes|h|hour|hours|d|day|days)\s*$", re.IGNORECASE)


def parse_freq(text: str) -> str:
    """A bar size in canonical form: ``"1d"`` or ``"<N>min"``.

    Raises:
        InputError: not a bar size; a multi-day size; minutes that do not divide a day.
    """
    m = _FREQ.match(str(text))
    if not m:
        raise InputError(f"--freq {text!r}: expected a bar size like 1min, 5min, 15min, 30min, 60min, 1h or 1d")
    n, unit = int(m.group(1)), m.group(2).lower()
    if unit.startswith("d"):
        if n != 1:
            raise InputError(f"--freq {text!r}: bars longer than a day are not supported")
        return DAILY
    minutes = n * 60 if unit.startswith("h") else n
    if minutes < 1 or MINUTES_PER_DAY % minutes:
        raise InputError(f"--freq {text!r}: a bar size in minutes must divide a day (1, 5, 15, 30, 60, ...)")
    return f"{minutes}min"


def minutes(freq: str) -> int:
    """Minutes per bar (a daily bar counts as a whole day)."""
    return MINUTES_PER_DAY if freq == DAILY else int(freq[:-3])


def unit(freq: str) -> str:
    """numpy datetime unit of a store with bars of ``freq``: "D" or "m"."""
    return "D" if freq == DAILY else "m"


def stamps(keys: np.ndarray, unit_: str) -> np.ndarray:
    """Keys -> ``datetime64[unit]``."""
    return np.asarray(keys, dtype=np.int64).astype(f"datetime64[{unit_}]")


def keys(times: np.ndarray, unit_: str) -> np.ndarray:
    """``datetime64`` values -> int64 keys in ``unit_`` (floored)."""
    return np.asarray(times).astype(f"datetime64[{unit_}]").astype(np.int64)


DENSE = 16   # keys spread over at most DENSE x their count (+ 64 Ki) are handled with a table over their span


def unique_keys(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct keys (int64). Keys whose span is not much wider than their count (days; a session's
    minutes) are marked in a table over that span: one pass, cheaper than hashing or sorting them."""
    k = np.asarray(keys)
    if not len(k):
        return np.zeros(0, dtype=np.int64)
    lo, hi = int(k.min()), int(k.max())
    if hi - lo >= DENSE * len(k) + (1 << 16):
        return np.unique(k).astype(np.int64)
    seen = np.zeros(hi - lo + 1, dtype=bool)
    seen[k - lo] = True
    return np.flatnonzero(seen) + lo


class KeyIndex:
    """Where keys sit in a sorted calendar of keys: a table over the calendar's span when that is not much wider
    than the calendar (4 bytes per key of span), else a binary search."""

    def __init__(self, calendar: np.ndarray) -> None:
        self.calendar = np.asarray(calendar, dtype=np.int64)
        n = len(self.calendar)
        self.lo = int(self.calendar[0]) if n else 0
        span = int(self.calendar[-1]) - self.lo + 1 if n else 0
        self.table = None
        if n and span <= DENSE * n + (1 << 16):
            self.table = np.full(span, -1, dtype=np.int32)
            self.table[self.calendar - self.lo] = np.arange(n, dtype=np.int32)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """int32 index of each key in the calendar, -1 for a key not in it."""
        keys = np.asarray(keys, dtype=np.int64)
        if self.table is not None:
            at = keys - self.lo
            inside = (at >= 0) & (at < len(self.table))
            if inside.all():
                return self.table[at]
            out = np.full(len(keys), -1, dtype=np.int32)
            out[inside] = self.table[at[inside]]
            return out
        if not len(self.calendar):
            return np.full(len(keys), -1, dtype=np.int32)
        pos = np.minimum(np.searchsorted(self.calendar, keys), len(self.calendar) - 1)
        return np.where(self.calendar[pos] == keys, pos, -1).astype(np.int32)


def iso(values: np.ndarray) -> list[str]:
    """Stamps as canonical text: ``YYYY-MM-DD`` for days, ``YYYY-MM-DDTHH:MM`` for minutes."""
    values = np.asarray(values)
    u = np.datetime_data(values.dtype)[0] if values.dtype.kind == "M" else "D"
    return np.datetime_as_string(values, unit="D" if u == "D" else "m").tolist()


def show(key: int, unit_: str) -> str:
    """One key as text, for messages (``2020-07-01`` or ``2020-07-01 09:31``)."""
    return iso(stamps(np.array([key]), unit_))[0].replace("T", " ")


def _same_day_gaps(minute_keys: np.ndarray, symbol_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bars sorted by symbol then stamp: ``(order, gap, same)`` where ``gap[j]`` is the minutes from sorted bar
    ``j`` to ``j + 1`` and ``same[j]`` says both are one symbol's bars of one day, at different stamps."""
    order = np.lexsort((minute_keys, symbol_codes))
    t, s = minute_keys[order], symbol_codes[order]
    gap = np.diff(t)
    same = (s[1:] == s[:-1]) & (t[1:] // MINUTES_PER_DAY == t[:-1] // MINUTES_PER_DAY) & (gap > 0)
    return order, gap, same


def finer_than(freq: str, minute_keys: np.ndarray, symbol_codes: np.ndarray) -> int | None:
    """Index (into the inputs) of a bar less than one ``freq`` after the symbol's previous bar of the same day,
    or None: bars finer than the bar size they are said to have."""
    if freq == DAILY or len(minute_keys) < 2:
        return None
    order, gap, same = _same_day_gaps(minute_keys, symbol_codes)
    hit = np.flatnonzero(same & (gap < minutes(freq)))
    return int(order[hit[0] + 1]) if hit.size else None


def detect_freq(minute_keys: np.ndarray, symbol_codes: np.ndarray) -> str:
    """The bar size of bars whose stamps carry times of day: the most common gap between a symbol's consecutive
    bars of one day; daily when no symbol has two bars on one day (a daily file whose close stamp varies, a
    15:00 among 14:59s, is still daily).

    Args:
        minute_keys: each bar's stamp in minutes since the epoch.
        symbol_codes: each bar's symbol.
    """
    _, gap, same = _same_day_gaps(minute_keys, symbol_codes)
    return freq_of_gaps(*np.unique(gap[same], return_counts=True))


def freq_of_gaps(values: np.ndarray, counts: np.ndarray) -> str:
    """The bar size whose gap (minutes) is the most common, given the distinct gaps and their counts (sorted);
    daily when there is none."""
    if values.size == 0:
        return DAILY
    size = int(values[np.argmax(counts)])
    if MINUTES_PER_DAY % size:
        raise InputError(f"bars are most often {size} minutes apart, which does not divide a day; pass --freq")
    return f"{size}min"
