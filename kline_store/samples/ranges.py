"""Date arguments and calendar bounds: ``start``/``end`` of a dataset and consecutive, embargoed splits.

Pure functions over the store's sorted calendar (``datetime64[D]`` trading dates, or ``datetime64[m]`` bar
stamps of an intraday store); no store, no torch. Bounds are calendar indices, so an embargo counts bars.
"""

from __future__ import annotations

import datetime as _dt
import itertools
from collections.abc import Sequence

import numpy as np

from ..errors import InputError
from ..store.periods import index_bounds, parse_when

DateLike = str | np.datetime64 | _dt.date | None


def to_time(value: DateLike, what: str) -> np.datetime64 | None:
    """A date or time argument as ``datetime64`` (None stays None), in the unit it was written in: a partial date
    (``"2012"``, ``"2012-03"``) stands for its whole period, as in pandas (store/periods.py).

    Raises:
        InputError: naming the argument, when the value is not a date or time.
    """
    return parse_when(value, what)


to_day = to_time   # the name of earlier releases


def date_bounds(dates: np.ndarray, start: DateLike = None, end: DateLike = None) -> tuple[int, int]:
    """Calendar-index bounds of a date range.

    Args:
        dates: the sorted calendar (``datetime64[D]`` days, or ``datetime64[m]`` bar stamps).
        start: first allowed date or time of ``t`` (None: the calendar's start).
        end: last allowed date or time of a label (None: the calendar's end); a date includes every bar of it,
            a partial date (``"2012"``, ``"2012-03"``) every bar of its year or month.

    Returns:
        ``(lo, hi)``: ``t >= lo`` and label bar ``<= hi``. ``lo > hi`` when the range holds no bar.
    """
    return index_bounds(dates, start, end)


def split_bounds(dates: np.ndarray, ranges: Sequence[tuple[DateLike, DateLike] | None], embargo: int,
                 names: Sequence[str] | None = None) -> list[tuple[int, int] | None]:
    """Calendar bounds of consecutive splits (train, valid, test, ...) with an embargo gap between them.

    Each split is ``(start, end)`` with the meaning of :func:`date_bounds`: ``t >= start`` and label day ``<= end``.
    The embargo is made by purging the earlier split: its last label day becomes at most ``embargo`` trading
    days before the next split's first ``t`` (so ``("2020-01-01", "2022-12-31"), ("2023-01-01", None)`` works as
    written). A missing ``end`` (None) reaches up to that limit; a missing ``start`` after the first split begins
    the day after the previous split's ``end`` plus the embargo. ``None`` instead of a pair skips that split.

    Args:
        dates: the trading calendar.
        ranges: one ``(start, end)`` per split, in time order.
        embargo: trading days that must lie strictly between a split's last label day and the next split's
            first ``t``.
        names: split names for error messages.

    Returns:
        ``(lo, hi)`` per split (None where the split was None).

    Raises:
        InputError: overlapping or unordered splits, or a split with nothing left after the embargo.
    """
    names = list(names or [f"split {i}" for i in range(len(ranges))])
    raw: list[list[int | None] | None] = []
    for r in ranges:
        if r is None:
            raw.append(None)
            continue
        s, e = r
        lo = None if s is None else date_bounds(dates, s, None)[0]
        hi = None if e is None else date_bounds(dates, None, e)[1]
        raw.append([lo, hi])
    present = [i for i, r in enumerate(raw) if r is not None]
    for a, b in itertools.pairwise(present):
        ra, rb = raw[a], raw[b]
        assert ra is not None and rb is not None
        if rb[0] is None:
            if ra[1] is None:
                raise InputError(f"{names[a]} has no end and {names[b]} has no start: give one of them")
            rb[0] = ra[1] + embargo + 1
        elif ra[1] is not None and ra[1] >= rb[0]:
            raise InputError(f"{names[a]} (labels up to {day_name(dates, ra[1])}) overlaps {names[b]} (from "
                             f"{day_name(dates, rb[0])}): give the splits in time order without overlap")
        limit = rb[0] - embargo - 1
        ra[1] = limit if ra[1] is None else min(ra[1], limit)
        if ra[0] is not None and ra[1] < ra[0]:
            raise InputError(f"{names[a]} holds no day once the {embargo}-day embargo before {names[b]} "
                             f"({day_name(dates, rb[0])}) is taken out")
    out: list[tuple[int, int] | None] = []
    for r in raw:
        if r is None:
            out.append(None)
        else:
            out.append((0 if r[0] is None else r[0], len(dates) - 1 if r[1] is None else r[1]))
    return out


def day_name(dates: np.ndarray, i: int) -> str:
    """The date at calendar index ``i``, or where ``i`` falls outside the calendar."""
    if 0 <= i < len(dates):
        return str(dates[i])
    return "before the calendar" if i < 0 else "after the calendar"
