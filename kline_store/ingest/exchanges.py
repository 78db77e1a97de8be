"""Exchange calendars by code (``XNYS``, ``XSHG``, ``XLON``, ...) through the optional ``exchange_calendars``
library: its holidays for daily stores (``--calendar XNYS``), and for intraday ones (``--sessions XSHG``) every
bar of each session, its lunch break and its early closes included, in the exchange's local time.

``pip install exchange_calendars`` (or ``kline-store[calendars]``); without it an exchange code is one line
saying so, and the hand-written templates (``--sessions ashare|us|24h``) still work.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import InputError
from ..store import sessions, timeaxis

_CODE = re.compile(r"^[A-Z][A-Z0-9]{2,4}$")   # upper case: XNYS; "tokyo" is a template name or a file
PIP = "pip install exchange_calendars (or 'kline-store[calendars]')"


def code_like(text: object) -> bool:
    """Shaped like an exchange code (a store's recorded ``calendar_source``), whatever files exist."""
    return isinstance(text, str) and bool(_CODE.match(text)) and text.lower() not in sessions.TEMPLATES


def is_code(text: object) -> bool:
    """An exchange code rather than a template name or a file: ``XNYS``, ``XSHG``, ``CMES``, ..."""
    if not isinstance(text, (str, os.PathLike)):
        return False
    s = str(text)
    return bool(_CODE.match(s)) and s.lower() not in sessions.TEMPLATES and not Path(s).exists()


class BeyondCover(InputError):
    """The installed exchange_calendars records no holidays of the exchange for the dates asked for."""


def _library(code: str) -> Any:
    try:
        import exchange_calendars as xc
    except ImportError:
        raise InputError(f"exchange calendar {code}: needs the optional package exchange_calendars: {PIP}") from None
    if code.upper() not in xc.get_calendar_names(include_aliases=True):
        known = ", ".join(sorted(n for n in xc.get_calendar_names(include_aliases=False) if n.startswith("X"))[:12])
        raise InputError(f"exchange calendar {code.upper()!r}: unknown to exchange_calendars (e.g. {known}, ...)")
    return xc


def _day(ts: Any) -> int | None:
    return None if ts is None else int(np.datetime64(ts.date(), "D").astype(np.int64))


def covered(code: str) -> tuple[int | None, int | None]:
    """The first and last day (days since 1970) whose holidays the installed exchange_calendars records for the
    exchange, None where it has no bound (holidays by rule, e.g. XNYS)."""
    xc = _library(code)
    dispatcher = getattr(getattr(xc, "calendar_utils", None), "global_calendar_dispatcher", None)
    try:
        factory = dispatcher._calendar_factories[dispatcher.resolve_alias(code.upper())]
    except Exception:   # the registry's layout is private: fall back on an instance
        factory = type(xc.get_calendar(code.upper()))
    none = lambda: None   # noqa: E731 (a library version without bounds)
    return _day(getattr(factory, "bound_min", none)()), _day(getattr(factory, "bound_max", none)())


def _version() -> str:
    from importlib.metadata import version
    return version("exchange_calendars")


def _show(day: int) -> str:
    return str(np.datetime64(int(day), "D"))


def _at(where: Callable[[int], str] | None, day: int) -> str:
    return f"{where(day)}: " if where is not None else ""


def beyond_cover(code: str, last_covered: int, day: int, where: Callable[[int], str] | None = None,
                 intraday: bool = False) -> BeyondCover:
    """The one line for dates past the installed library's last covered day, with the ways out."""
    instead = ("or --sessions TEMPLATE|FILE for a new store" if intraday
               else "or pass --calendar FILE listing the trading dates")
    return BeyondCover(
        f"{_at(where, day)}{_show(day)} is after {_show(last_covered)}, the last day whose {code.upper()} holidays "
        f"exchange_calendars {_version()} records: ways out: upgrade exchange_calendars (pip install -U "
        f"exchange_calendars), {instead}, or --assume-weekdays (the exchange's weekdays after "
        f"{_show(last_covered)}{', with its usual sessions' if intraday else ''}, holidays unknown, marked in the "
        f"manifest); nothing stored")


def _calendar(code: str, first_day: int, last_day: int, where: Callable[[int], str] | None = None,
              intraday: bool = False) -> Any:
    """The library's calendar over [first_day, last_day]; one line naming the bar (``where(day)``) for dates
    outside what the library records."""
    xc = _library(code)
    code = code.upper()
    lo, hi = covered(code)
    if lo is not None and first_day < lo:
        raise InputError(f"{_at(where, first_day)}{_show(first_day)} is before {_show(lo)}, the first day whose {code} "
                         f"holidays exchange_calendars {_version()} records; leave the earlier bars out or pass "
                         f"--calendar FILE")
    if hi is not None and last_day > hi:
        raise beyond_cover(code, hi, last_day, where, intraday)
    # A margin before the first day, so that a first day that is no session (a holiday) still lies inside.
    start = first_day - 7 if lo is None else max(first_day - 7, lo)
    end = max(int(last_day), start + 1)   # the library wants start < end
    try:
        return xc.get_calendar(code, start=_show(start), end=_show(end))
    except Exception as exc:   # dates out of the library's reach, ...
        raise InputError(f"{_at(where, first_day)}exchange calendar {code} from {_show(first_day)} to "
                         f"{_show(last_day)}: {' '.join(str(exc).split())[:200]}") from None


def trading_days(code: str, first_day: int, last_day: int, where: Callable[[int], str] | None = None,
                 assume_weekdays: bool = False) -> np.ndarray:
    """The exchange's sessions from ``first_day`` to ``last_day`` (days since 1970), as int64 days.

    ``where(day)`` names the bar of a day for a message. With ``assume_weekdays``, days after the library's last
    covered day are the exchange's weekdays (holidays unknown) instead of an error."""
    first_day, last_day = int(first_day), int(last_day)
    if assume_weekdays:
        _, hi = covered(code)
        if hi is not None and last_day > hi:
            known = trading_days(code, first_day, hi, where) if first_day <= hi else np.zeros(0, np.int64)
            return np.concatenate([known, weekdays(code, max(first_day, hi + 1), last_day)])
    cal = _calendar(code, first_day, last_day, where)
    days = cal.sessions.values.astype("datetime64[D]").astype(np.int64)
    return days[(days >= first_day) & (days <= last_day)]


def weekdays(code: str, first_day: int, last_day: int) -> np.ndarray:
    """The exchange's trading weekdays (its week mask, Monday to Friday for most) from first to last day."""
    _, hi = covered(code)
    cal = _calendar(code, hi - 14, hi) if hi is not None else _calendar(code, first_day, first_day + 7)
    mask = str(getattr(cal, "weekmask", "1111100"))
    days = np.arange(first_day, last_day + 1, dtype=np.int64)
    return days[np.array([mask[int((d + 3) % 7)] == "1" for d in days], dtype=bool)] if len(days) else days


def extend_days(code: str, stored: np.ndarray, days: np.ndarray, where: Callable[[int], str] | None = None,
                assume_weekdays: bool = False) -> np.ndarray:
    """A daily store's calendar after an append: its stored dates, and the exchange's sessions from its last
    date to the input's last (and from the input's first to its first), as a full ingest would have them."""
    stored = np.asarray(stored, dtype=np.int64)
    parts = [stored]
    if len(days) and (not len(stored) or days.max() > stored[-1]):
        lo = int(stored[-1]) + 1 if len(stored) else int(days.min())
        parts.append(trading_days(code, lo, int(days.max()), where, assume_weekdays))
    if len(days) and len(stored) and days.min() < stored[0]:
        parts.append(trading_days(code, int(days.min()), int(stored[0]) - 1, where, assume_weekdays))
    return np.unique(np.concatenate(parts))


def assumed(code: str, keys: np.ndarray, unit: str, before: dict | None = None) -> dict | None:
    """The manifest's mark of the days taken as weekdays (--assume-weekdays): those after the library's last
    covered day through the calendar's last day; ``before``: the store's mark so far (kept, and extended)."""
    if not len(keys):
        return before
    last = int(keys.max()) if unit == "D" else int((keys.max() - 1) // timeaxis.MINUTES_PER_DAY)
    hi = covered(code)[1]
    if hi is None or last <= hi:
        return before
    if before:
        last = max(last, int(np.datetime64(before["through"], "D").astype(np.int64)))
    return {"exchange": code.upper(), "after": before["after"] if before else _show(hi), "through": _show(last),
            "note": "dates after 'after' are the exchange's weekdays: its holidays were not known"}


def _local_minutes(col: Any, tz: Any) -> np.ndarray:
    """A column of UTC timestamps -> local minutes since 1970 (-1 where there is none: no lunch break)."""
    import pandas as pd   # exchange_calendars depends on it

    local = pd.DatetimeIndex(col).tz_convert(tz).tz_localize(None).values
    return np.where(np.isnat(local), -1, local.astype("datetime64[m]").astype(np.int64))


def session_table(code: str, first_day: int, last_day: int, where: Callable[[int], str] | None = None
                  ) -> dict[str, np.ndarray]:
    """Per session: its day and its open, close and (lunch) break, in local minutes since 1970 (-1: no break)."""
    cal = _calendar(code, first_day, last_day, where, intraday=True)
    sched = cal.schedule.loc[str(np.datetime64(int(first_day), "D")): str(np.datetime64(int(last_day), "D"))]
    out = {"day": sched.index.values.astype("datetime64[D]").astype(np.int64)}
    for col in ("open", "close", "break_start", "break_end"):
        out[col] = _local_minutes(sched[col], cal.tz)
    return out


def intervals_of(t: dict[str, np.ndarray]) -> list[tuple[tuple[int, int], ...]]:
    """Each session's trading intervals as minutes of its day: one, or two around a lunch break."""
    out = []
    for d, o, c, bs, be in zip(t["day"], t["open"], t["close"], t["break_start"], t["break_end"]):
        base = int(d) * timeaxis.MINUTES_PER_DAY
        if bs >= 0 and be >= 0:
            out.append(((int(o) - base, int(bs) - base), (int(be) - base, int(c) - base)))
        else:
            out.append(((int(o) - base, int(c) - base),))
    return out


def template(code: str, keys: np.ndarray, stamp: str | None, where: Callable[[int], str] | None = None,
             assume_weekdays: bool = False) -> sessions.Sessions:
    """The exchange's usual trading day (its most common sessions over the input's dates) as a Sessions record
    for the manifest; the calendar itself follows every day's own sessions (intraday_calendar). With
    ``assume_weekdays``, over the input's dates the library covers."""
    k = np.asarray(keys, dtype=np.int64)
    hi = covered(code)[1] if assume_weekdays else None
    if hi is not None and (k < (hi + 1) * timeaxis.MINUTES_PER_DAY).any():
        k = k[k < (hi + 1) * timeaxis.MINUTES_PER_DAY]
    table = _table(code, k, where)
    days = intervals_of(table)
    if not days:
        raise InputError(f"exchange calendar {code.upper()}: no session between the input's first and last date")
    kinds, counts = np.unique(np.array([repr(d) for d in days]), return_counts=True)
    usual = days[[repr(d) for d in days].index(kinds[int(np.argmax(counts))])]
    return sessions.Sessions(code.upper(), tuple(usual), stamp or "end")


def _table(code: str, keys: np.ndarray, where: Callable[[int], str] | None = None) -> dict[str, np.ndarray]:
    first, last = int(keys.min() // timeaxis.MINUTES_PER_DAY), int((keys.max() - 1) // timeaxis.MINUTES_PER_DAY)
    return session_table(code, first, max(first, last), where)


def intraday_calendar(keys: np.ndarray, code: str, freq: str, stamp: str, where: Callable[[int], str] | None = None,
                      usual: sessions.Sessions | None = None) -> np.ndarray:
    """Every bar of ``freq`` in each of the exchange's sessions from the input's first date to its last bar
    (holidays have none, an early close ends early, the lunch break has none), as minute keys.

    With ``usual`` (the store's usual trading day, under --assume-weekdays), days after the library's last
    covered day are the exchange's weekdays with the usual sessions, instead of an error."""
    k = np.asarray(keys, dtype=np.int64)
    if k.size == 0:
        return k
    step = timeaxis.minutes(freq)
    first, last = int(k.min() // timeaxis.MINUTES_PER_DAY), int((k.max() - 1) // timeaxis.MINUTES_PER_DAY)
    last = max(first, last)
    _, hi = covered(code) if usual is not None else (None, None)
    assumed = np.zeros(0, np.int64)
    if hi is not None and last > hi:
        assumed = weekdays(code, max(first, hi + 1), last)
        last = hi
    out = []
    if first <= last:
        table = session_table(code, first, last, where)
        for day, parts in zip(table["day"], intervals_of(table)):
            base = int(day) * timeaxis.MINUTES_PER_DAY
            for a, b in parts:
                ends = np.arange(a + step, b + 1, step, dtype=np.int64)
                out.append(base + (ends if stamp == "end" else ends - step))
    if len(assumed):
        out.append((assumed[:, None] * timeaxis.MINUTES_PER_DAY + usual.day_stamps(freq)[None, :]).reshape(-1))
    cal = np.unique(np.concatenate(out)) if out else np.zeros(0, np.int64)
    return cal[cal <= k.max()]


@dataclass(frozen=True)
class Exchange:
    """The exchange calendar an append follows: the store's (--calendar CODE / --sessions CODE at ingest) or
    one given to this append (--calendar CODE, a daily store), and whether days past the library's last
    covered day are assumed to be weekdays (--assume-weekdays, or a store already marked so)."""

    code: str | None
    given: bool = False
    assume_weekdays: bool = False

    @classmethod
    def of(cls, manifest: dict, code: str | None, assume_weekdays: bool) -> Exchange:
        src = manifest.get("calendar_source")
        stored = manifest.get("exchange") or (str(src).upper() if not manifest.get("sessions") and code_like(src)
                                              else None)
        if code and stored and code != stored:
            raise InputError(f"--calendar {code}: the store follows the {stored} calendar")
        assume = assume_weekdays or bool(manifest.get("assumed_weekdays"))
        if assume_weekdays and not (code or stored):
            raise InputError("--assume-weekdays applies to a store that follows an exchange calendar (ingested "
                             "with --calendar CODE or --sessions CODE) or with --calendar CODE")
        return cls(code or stored, bool(code), assume)

    def marks(self, manifest: dict, cal: np.ndarray, unit: str, daily: bool) -> dict:
        """What the new version records of the exchange it follows: its code, and the days assumed weekdays."""
        if self.code is None:
            return {}
        out = {"exchange": self.code} if daily else {}
        if self.given:
            out["calendar_source"] = self.code
        if self.assume_weekdays:
            mark = assumed(self.code, cal, unit, manifest.get("assumed_weekdays"))
            if mark:
                out["assumed_weekdays"] = mark
        return out
