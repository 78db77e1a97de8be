"""A time of day in its own column (``Date,Time``; MetaTrader's ``<DATE>,<TIME>``; tushare's ``trade_date,
trade_time``) joined to the date column's cell, so that dates.py reads one stamp.

Times are ``HH:MM``, ``HH:MM:SS[.f]``, ``HHMMSS`` or ``HHMM`` digits (an integer column drops the leading zero:
``93100`` is 09:31:00), a Parquet ``time`` or the time of a datetime. A bad time is an error naming its line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import polars as pl

from . import columns
from ..errors import InputError

_CLOCK = r"^(\d{1,2}):(\d{2})(?::(\d{2})(\.\d+)?)?$"
_DIGITS = r"^\d{1,6}$"
EXPECTED = "expected HH:MM[:SS] or HHMMSS"


def date_text(raw: pl.Series) -> pl.Series:
    """The date column's cells as text: ISO for temporal columns, digits for YYYYMMDD integers."""
    dt = raw.dtype
    if dt == pl.Date or isinstance(dt, pl.Datetime):
        return raw.cast(pl.Date).cast(pl.String)
    if dt.is_integer():
        return raw.cast(pl.String)
    if dt.is_float():
        return raw.cast(pl.Int64, strict=False).cast(pl.String)
    return raw.cast(pl.String).str.strip_chars()


def clock_text(raw: pl.Series, path: Path, column: str, line: Callable[[int], str]) -> pl.Series:
    """Times of day as ``HH:MM:SS`` text (null where the cell is empty); InputError at the first bad one."""
    dt = raw.dtype
    if dt == pl.Time:
        return raw.dt.strftime("%H:%M:%S")
    if isinstance(dt, pl.Datetime):
        return raw.dt.strftime("%H:%M:%S")
    if dt.is_float():
        whole = raw.fill_nan(None)
        if (whole.drop_nulls() != whole.drop_nulls().round(0)).any():
            i = int(((whole != whole.round(0)).fill_null(False)).arg_max())
            raise InputError(f"{path}: {line(i)}: column {column!r}: not a time of day {columns.short(raw[i])} "
                             f"({EXPECTED})")
        raw = whole.cast(pl.Int64)
    text = raw.cast(pl.String).str.strip_chars()
    text = pl.select(pl.when(text.is_in(columns.NULL_VALUES)).then(None).otherwise(text).alias("t")).to_series()
    digits = text.str.contains(_DIGITS).fill_null(False)
    width = 6 if (text.filter(digits).str.len_chars() >= 5).any() else 4
    padded = text.str.zfill(width)
    hh = pl.select(pl.when(digits).then(padded.str.slice(0, 2)).otherwise(text.str.extract(_CLOCK, 1))).to_series()
    mm = pl.select(pl.when(digits).then(padded.str.slice(2, 2)).otherwise(text.str.extract(_CLOCK, 2))).to_series()
    ss = pl.select(pl.when(digits).then(padded.str.slice(4, 2) if width == 6 else pl.lit("00"))
                   .otherwise(text.str.extract(_CLOCK, 3).fill_null("00"))).to_series()
    h, m, s = (x.cast(pl.Int64, strict=False) for x in (hh, mm, ss))
    short = digits & (text.str.len_chars() < width - 1)   # "9" or "31": part of a time, not HMM or HHMM
    bad = text.is_not_null() & (h.is_null() | m.is_null() | s.is_null() | (h > 23) | (m > 59) | (s > 59)
                                | short).fill_null(True)
    if bad.any():
        i = int(bad.arg_max())
        raise InputError(f"{path}: {line(i)}: column {column!r}: not a time of day {columns.short(raw[i])} "
                         f"({EXPECTED})")
    # a fraction of a second is kept: the stamp then has seconds, refused or rounded (--round-stamps) as any
    frac = pl.select(pl.when(digits).then(pl.lit("")).otherwise(text.str.extract(_CLOCK, 4).fill_null(""))).to_series()
    return pl.select(pl.when(text.is_null()).then(None)
                     .otherwise(pl.concat_str([pl.concat_str([hh.str.zfill(2), mm, ss.str.zfill(2)], separator=":"),
                                               frac]))).to_series()


def empty_times(date_raw: pl.Series, time_raw: pl.Series) -> pl.Series | None:
    """Rows whose time cell is empty (or a missing-value marker) while their date is there, in a piece where other
    rows have a time of day; None when there is none (a daily file's empty Time column stays daily)."""
    text = time_raw.cast(pl.String).str.strip_chars()
    missing = (text.is_null() | text.is_in(columns.NULL_VALUES) | (text == "")).fill_null(True)
    if not missing.any() or missing.all():
        return None
    return missing & date_raw.is_not_null()


def join_stamp(date_raw: pl.Series, time_raw: pl.Series, path: Path, column: str,
               line: Callable[[int], str]) -> pl.Series:
    """``date + " " + time`` as text for dates.parse_dates; the date alone where the time is empty."""
    day = date_text(date_raw)
    clock = clock_text(time_raw, path, column, line)
    return pl.select(pl.when(clock.is_null()).then(day)
                     .otherwise(pl.concat_str([day, clock], separator=" ")).alias(date_raw.name)).to_series()


def holds_dates(head: pl.Series) -> bool:
    """True when a "time" column's first cells are whole stamps (tushare's ``trade_time``: a date and a time):
    then it is the date column, and the date-only column beside it is left out."""
    cells = head.cast(pl.String).str.strip_chars().drop_nulls()
    return cells.len() > 0 and bool(cells.str.contains(r"^\d{4}[-/.]?\d{2}[-/.]?\d{2}[ T]\d").all())
