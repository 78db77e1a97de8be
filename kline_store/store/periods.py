"""Date arguments as pandas reads them: a partial date is its whole period.

``"2012"`` is the year 2012, ``"2012-03"`` March 2012, ``"2012-03-05"`` that day (every bar of it), ``"2012-03-05
14"`` that hour, ``"2012-03-05 14:30"`` that minute: as ``start`` the first bar of the period, as ``end`` the last
(pandas' ``.loc["2011":"2012"]``). ``datetime.date``/``datetime.datetime``/``numpy.datetime64``/``pandas.Timestamp``
are taken as they are (a date is its day). Shared by the datasets' ``start``/``end`` and ``Store.to_polars``.
"""

from __future__ import annotations

import datetime as _dt

import numpy as np

from ..errors import InputError

WHOLE = ("Y", "M", "W", "D", "h")   # units whose value is a period, not an instant


def parse_when(value: object, what: str) -> np.datetime64 | None:
    """A date or time argument as ``datetime64`` in the unit it was written in (None stays None): ``"2012"`` ->
    ``datetime64[Y]``, ``"2012-03"`` -> ``[M]``, a date -> ``[D]``, a time -> ``[m]`` (or finer when given).

    Raises:
        InputError: naming the argument, when the value is not a date or time.
    """
    if value is None:
        return None
    given = value
    try:
        if isinstance(value, _dt.datetime):
            value = np.datetime64(value.replace(tzinfo=None), "m")
        elif isinstance(value, _dt.date):
            value = np.datetime64(value, "D")
        elif hasattr(value, "to_datetime64"):  # pandas.Timestamp without importing pandas
            value = value.to_datetime64()
        elif isinstance(value, str):
            value = np.datetime64(value.strip().replace(" ", "T"))
        elif isinstance(value, (int, np.integer)) and 1800 <= int(value) <= 2200:
            value = np.datetime64(str(int(value)), "Y")   # end=2012: the year, as "2012"
        t = np.datetime64(value)
    except (ValueError, TypeError):
        raise InputError(f"{what}={given!r}: not a date; use 'YYYY', 'YYYY-MM', 'YYYY-MM-DD' (or 'YYYY-MM-DD HH:MM' "
                         f"for intraday stores), datetime.date or numpy.datetime64") from None
    if np.isnat(t):
        raise InputError(f"{what}={given!r}: not a date")
    unit = np.datetime_data(t.dtype)[0]
    if unit in WHOLE:
        return t
    return t.astype("datetime64[m]") if unit in ("m", "s", "ms", "us", "ns") and t == t.astype("datetime64[m]") else t


def period_end(t: np.datetime64) -> np.datetime64 | None:
    """The first instant after the period ``t`` stands for (None when ``t`` is an instant)."""
    unit = np.datetime_data(t.dtype)[0]
    return t + np.timedelta64(1, unit) if unit in WHOLE else None


def index_bounds(dates: np.ndarray, start: object = None, end: object = None) -> tuple[int, int]:
    """``(lo, hi)``: the calendar indices of the first bar at or after ``start`` and the last bar within ``end``
    (its whole period for a partial date); ``lo > hi`` when the range holds no bar."""
    s, e = parse_when(start, "start"), parse_when(end, "end")
    lo = 0 if s is None else int(np.searchsorted(dates, s, side="left"))
    if e is None:
        return lo, len(dates) - 1
    after = period_end(e)
    if after is not None:
        return lo, int(np.searchsorted(dates, after, side="left")) - 1
    return lo, int(np.searchsorted(dates, e, side="right")) - 1
