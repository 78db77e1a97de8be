"""Exchange calendars by code (``XNYS``, ``XSHG``, ``XLON``, ...) through the optional ``exchange_calendars``
library: its holidays for daily stores (``--calendar XNYS``), and for intraday ones (``--sessions XSHG``) every
bar of each session, its lunch break and its early closes included, in the exchange's local time.

``pip install exchange_calendars`` (or ``kline-store[calendars]``); without it an exchange code is one line
saying so, and the hand-written templates (``--sessions ashare|us|24h``) still work.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..store import sessions as SE, timeaxis as TA

_CODE = re.compile(r"^[A-Z][A-Z0-9]{2,4}$")   # upper case: XNYS; "tokyo" is a template name or a file
PIP = "pip install exchange_calendars (or 'kline-store[calendars]')"


def is_code(text: object) -> bool:
    """An exchange code rather than a template name or a file: ``XNYS``, ``XSHG``, ``CMES``, ..."""
    if not isinstance(text, (str, os.PathLike)):
        return False
    s = str(text)
    return bool(_CODE.match(s)) and s.lower() not in SE.TEMPLATES and not Path(s).exists()


def _calendar(code: str, first_day: int, last_day: int) -> Any:
    try:
        import exchange_calendars as xc
    except ImportError:
        raise InputError(f"exchange calendar {code}: needs the optional package exchange_calendars: {PIP}") from None
    code = code.upper()
    if code not in xc.get_calendar_names(include_aliases=True):
        known = ", ".join(sorted(n for n in xc.get_calendar_names(include_aliases=False) if n.startswith("X"))[:12])
        raise InputError(f"exchange calendar {code!r}: unknown to exchange_calendars (e.g. {known}, ...)")
    start = np.datetime64(int(first_day), "D")
    end = np.datetime64(max(int(last_day), int(first_day) + 7), "D")   # the library wants start < end
    try:
        return xc.get_calendar(code, start=str(start), end=str(end))
    except Exception as exc:   # dates before the calendar's first session, ...
        raise InputError(f"exchange calendar {code}: {' '.join(str(exc).split())[:200]}") from None


def trading_days(code: str, first_day: int, last_day: int) -> np.ndarray:
    """The exchange's sessions from ``first_day`` to ``last_day`` (days since 1970), as int64 days."""
    cal = _calendar(code, first_day, last_day)
    sessions = cal.sessions_in_range(str(np.datetime64(int(first_day), "D")), str(np.datetime64(int(last_day), "D")))
    return sessions.values.astype("datetime64[D]").astype(np.int64)


def _local_minutes(col: Any, tz: Any) -> np.ndarray:
    """A column of UTC timestamps -> local minutes since 1970 (-1 where there is none: no lunch break)."""
    import pandas as pd   # exchange_calendars depends on it

    local = pd.DatetimeIndex(col).tz_convert(tz).tz_localize(None).values
    return np.where(np.isnat(local), -1, local.astype("datetime64[m]").astype(np.int64))


def session_table(code: str, first_day: int, last_day: int) -> dict[str, np.ndarray]:
    """Per session: its day and its open, close and (lunch) break, in local minutes since 1970 (-1: no break)."""
    cal = _calendar(code, first_day, last_day)
    sched = cal.schedule.loc[str(np.datetime64(int(first_day), "D")): str(np.datetime64(int(last_day), "D"))]
    out = {"day": sched.index.values.astype("datetime64[D]").astype(np.int64)}
    for col in ("open", "close", "break_start", "break_end"):
        out[col] = _local_minutes(sched[col], cal.tz)
    return out


def intervals_of(t: dict[str, np.ndarray]) -> list[tuple[tuple[int, int], ...]]:
    """Each session's trading intervals as minutes of its day: one, or two around a lunch break."""
    out = []
    for d, o, c, bs, be in zip(t["day"], t["open"], t["close"], t["break_start"], t["break_end"]):
        base = int(d) * TA.MINUTES_PER_DAY
        if bs >= 0 and be >= 0:
            out.append(((int(o) - base, int(bs) - base), (int(be) - base, int(c) - base)))
        else:
            out.append(((int(o) - base, int(c) - base),))
    return out


def template(code: str, keys: np.ndarray, stamp: str | None) -> SE.Sessions:
    """The exchange's usual trading day (its most common sessions over the input's dates) as a Sessions record
    for the manifest; the calendar itself follows every day's own sessions (intraday_calendar)."""
    k = np.asarray(keys, dtype=np.int64)
    table = _table(code, k)
    days = intervals_of(table)
    if not days:
        raise InputError(f"exchange calendar {code.upper()}: no session between the input's first and last date")
    kinds, counts = np.unique(np.array([repr(d) for d in days]), return_counts=True)
    usual = days[[repr(d) for d in days].index(kinds[int(np.argmax(counts))])]
    return SE.Sessions(code.upper(), tuple(usual), stamp or "end")


def _table(code: str, keys: np.ndarray) -> dict[str, np.ndarray]:
    first, last = int(keys.min() // TA.MINUTES_PER_DAY), int((keys.max() - 1) // TA.MINUTES_PER_DAY)
    return session_table(code, first, max(first, last))


def intraday_calendar(keys: np.ndarray, code: str, freq: str, stamp: str) -> np.ndarray:
    """Every bar of ``freq`` in each of the exchange's sessions from the input's first date to its last bar
    (holidays have none, an early close ends early, the lunch break has none), as minute keys."""
    k = np.asarray(keys, dtype=np.int64)
    if k.size == 0:
        return k
    step = TA.minutes(freq)
    table = _table(code, k)
    out = []
    for day, parts in zip(table["day"], intervals_of(table)):
        base = int(day) * TA.MINUTES_PER_DAY
        for a, b in parts:
            ends = np.arange(a + step, b + 1, step, dtype=np.int64)
            out.append(base + (ends if stamp == "end" else ends - step))
    cal = np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)
    return cal[cal <= k.max()]
