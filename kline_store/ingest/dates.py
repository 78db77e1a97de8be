"""Date cells -> local timestamps: YYYYMMDD integers, ISO dates, datetimes with a time of day, M/D/YYYY, ...

The result keeps the time of day when the file has one (intraday bars need it; a daily file's constant
``15:00:00`` is dropped later, when the store's bar size is known) and is local and naive. A stamp is read
whole or refused (``1:31 PM`` is 13:31; ``09:31 foo`` is an error). With an exchange zone (:func:`exchange_zone`,
from ``--timezone`` or the store's manifest) stamps with a UTC offset or ``Z`` and zone-aware Parquet columns
are converted to its clock; without one, a zone-aware column or a single offset keeps its wall clock and mixed
offsets are refused naming the first two. Long files repeat each date once per symbol, so only the
distinct values are parsed. Dates outside 1800-01-01..2200-12-31 are errors: such a value is a placeholder or
a typo, and a calendar stretched to it would reserve room for centuries of days.
"""

from __future__ import annotations

import re

from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Callable, Iterator
from zoneinfo import ZoneInfo

import numpy as np
import polars as pl

from . import columns
from ..errors import InputError

FIRST_DAY, LAST_DAY = np.datetime64("1800-01-01"), np.datetime64("2200-12-31")
EXPECTED = "accepted: YYYYMMDD[HHMM], YYYY-MM-DD[ HH:MM[:SS]], M/D/YYYY, YYYY/MM/DD"
TIME = pl.Datetime("ms")
# date, time of day, AM/PM, UTC offset: a stamp with a clock must match all of it (else it is refused)
_STAMP = (r"^(?<date>.+?)[\sT](?<clock>\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?)\s*(?<ampm>[AaPp][Mm])?"
          r"\s*(?<zone>[Zz]|UTC|GMT|[+-]\d{2}(?::?\d{2})?)?$")
# Stamps with a UTC offset are converted to this zone's clock (ingest --timezone, the store's timezone)
ZONE: ContextVar[str | None] = ContextVar("kline_store_exchange_zone", default=None)
# Within exchange_zone: stamps whose date the conversion changed, per piece of a file (read again: replaced)
MOVED: ContextVar[dict | None] = ContextVar("kline_store_moved_dates", default=None)

Line = Callable[[int], str]   # index of a value in the column -> "line N" (see inputs.location)


def parse_dates(raw: pl.Series, path: Path, column: str, line: Line) -> pl.Series:
    """Parse a date column into local timestamps (``pl.Datetime("ms")``, midnight where there is no time of
    day); raise InputError naming the file, line, column and value of the first bad date.

    Args:
        raw: the column as read (strings, integers, floats or temporal values).
        path: the file, for messages.
        column: the column's name in the file.
        line: where the i-th value of ``raw`` is.
    """
    if raw.dtype.is_integer() and not raw.null_count() and raw.len() and \
            int(raw.min()) >= 18000101 and int(raw.max()) <= 22001231:   # type: ignore[arg-type]
        out = _yyyymmdd(raw, path, column, line).cast(TIME)
    else:
        uniq = raw.drop_nulls().unique(maintain_order=True)   # first-seen order: name the earliest line
        parsed = _parse_unique(uniq, raw, path, column, line)
        _check_range(parsed.dt.date(), uniq, raw, path, column, line)
        out = raw.replace_strict(uniq, parsed, default=None, return_dtype=TIME)
        if out.null_count():
            raise InputError(f"{path}: {line(out.is_null().arg_max())}: missing date in column {column!r}")
    return out.alias("date")


def with_format(text: pl.Expr, fmt: str) -> pl.Expr:
    """Stamps read from text with a strftime format as polars (chrono) takes it (``%.f`` fractions, ``%I``/``%p``
    12-hour clocks, ``%b`` month names); null where a cell does not match. An hour without minutes
    (``2019-10-17 09-AM``: polars wants both) gets a zero minute added to the cell and the format."""
    if re.search(r"%[HIkl]", fmt) and not re.search(r"%[MRTX]", fmt):
        text, fmt = text + "\x1f00", fmt + "\x1f%M"
    return text.str.strptime(TIME, fmt, strict=False)


def parse_days(raw: pl.Series, path: Path, column: str, line: Line) -> pl.Series:
    """A column of dates (a calendar file): the date part of :func:`parse_dates`."""
    return parse_dates(raw, path, column, line).dt.date()


def _check_range(parsed: pl.Series, uniq: pl.Series, raw: pl.Series, path: Path, column: str, line: Line) -> None:
    days = parsed.cast(pl.Int32).to_numpy()
    lo, hi = int(FIRST_DAY.astype(np.int64)), int(LAST_DAY.astype(np.int64))
    out = (days < lo) | (days > hi)
    if out.any():
        j = int(np.flatnonzero(out)[0])
        i = (raw == uniq[j]).arg_max()
        value, got = str(uniq[j]), parsed[j]
        if f"{got.year:04d}" not in value:   # "19-Sep-03" read as year 3: the format was guessed wrong
            raise InputError(f"{path}: {line(i)}: date {value!r} in column {column!r}: its format could not be read "
                             f"(a guess gives {got}); pass --date-format FMT, e.g. {_suggest(value)!r}")
        raise InputError(f"{path}: {line(i)}: date {got} ({uniq[j]!r}) in column {column!r} is outside "
                         f"{FIRST_DAY}..{LAST_DAY}")


def _suggest(value: str) -> str:
    """A --date-format for a date whose year is written with two digits or a month by name, as an example."""
    sep = next((c for c in value if not c.isalnum()), "-")
    parts = value.split(sep)
    names = ["%b" if p.isalpha() else "%d" for p in parts]
    if len(parts) == 3:
        names[-1] = "%y" if len(parts[-1]) == 2 else "%Y"
        if parts[0].isalpha():
            names[:2] = ["%b", "%d"]
    return sep.join(names)


def _yyyymmdd(raw: pl.Series, path: Path, column: str, line: Line) -> pl.Series:
    """YYYYMMDD integers -> dates (tushare's trade_date); rejects 20240230 and years outside 1800..2200.

    Converts the distinct values only, then gathers through a lookup table indexed by value.
    """
    v = np.asarray(raw.to_numpy(), dtype=np.int64)
    lo, hi = int(v.min()), int(v.max())   # bounded: 18000101..22001231, so the values are marked in a table
    at = v - lo
    seen = np.zeros(hi - lo + 1, dtype=bool)
    seen[at] = True
    uniq = np.flatnonzero(seen) + lo
    y, m, d = uniq // 10000, uniq // 100 % 100, uniq % 100
    months = (y - 1970) * 12 + (m - 1)
    days = months.astype("datetime64[M]").astype("datetime64[D]") + (d - 1)
    back = days.astype("datetime64[M]").astype(np.int64)
    bad = (m < 1) | (m > 12) | (d < 1) | (back != months) | (y < 1800) | (y > 2200)
    if bad.any():
        value = int(uniq[np.flatnonzero(bad)[0]])
        i = int(np.flatnonzero(v == value)[0])
        raise InputError(f"{path}: {line(i)}: unparseable date {value} in column {column!r} "
                         f"(expected YYYYMMDD, years 1800..2200)")
    table = np.zeros(hi - lo + 1, dtype=np.int64)   # milliseconds: the series is then a stamp as it stands
    table[uniq - lo] = days.astype(np.int64) * 86_400_000
    return pl.Series("date", table[at]).cast(TIME)


def _digit_stamps(text: pl.Series) -> pl.Series | None:
    """Stamps written as digits only, all ``YYYYMMDDHHMM`` or all ``YYYYMMDDHHMMSS`` (null where not a valid
    time); None for any other column."""
    for digits, fmt in ((12, "%Y%m%d%H%M"), (14, "%Y%m%d%H%M%S")):
        if text.len() and text.str.contains(rf"^\d{{{digits}}}$").all():
            return text.str.to_datetime(fmt, strict=False, time_unit="ms")
    return None


def temporal(col: pl.Expr, dt: pl.DataType) -> pl.Expr | None:
    """A Date or Datetime column as local stamps (each value on its own: a Parquet file's column is converted as
    polars reads it); None for other types."""
    if dt == pl.Date:
        return col.cast(TIME)
    if not isinstance(dt, pl.Datetime):
        return None
    if dt.time_zone:
        if ZONE.get() is not None:   # to the exchange's clock
            return col.dt.convert_time_zone(ZONE.get()).dt.replace_time_zone(None).cast(TIME)
        return col.dt.replace_time_zone(None).cast(TIME)   # the local wall clock, not the UTC one
    return col.cast(TIME)


def _parse_unique(uniq: pl.Series, raw: pl.Series, path: Path, name: str, line: Line) -> pl.Series:
    dt = uniq.dtype

    def fail(value: object, expected: str) -> InputError:
        i = (raw == value).arg_max()
        return InputError(f"{path}: {line(i)}: unparseable date {columns.short(value)} in column {name!r} "
                          f"({expected})")

    local = temporal(pl.col(uniq.name), dt)
    if local is not None:
        return uniq.to_frame().select(local).to_series()
    if dt.is_temporal():
        return uniq.cast(TIME)
    if dt.is_integer() or dt.is_float():
        whole = uniq.cast(pl.Float64)
        if (whole != whole.round(0)).any():
            raise fail(uniq.filter(whole != whole.round(0))[0], "expected YYYYMMDD")
        text = whole.cast(pl.Int64).cast(pl.String)   # 19991110.0 (pandas after a NaN) is 19991110
        out = _digit_stamps(text)
        if out is None:
            out = text.str.to_date("%Y%m%d", strict=False).cast(TIME)
        if out.null_count():
            raise fail(uniq.filter(out.is_null())[0], "expected YYYYMMDD or YYYYMMDDHHMM")
        return out
    if dt not in (pl.String, pl.Categorical) and not isinstance(dt, pl.Enum):
        raise InputError(f"{path}: date column {name!r} has type {dt}; expected dates, text or YYYYMMDD numbers")
    text = uniq.cast(pl.String).str.strip_chars()
    out = _digit_stamps(text)   # YYYYMMDDHHMM[SS] written as text
    if out is not None:
        if out.null_count():
            raise fail(uniq.filter(out.is_null())[0], "expected YYYYMMDDHHMM[SS]")
        return out
    clock = None
    if text.str.contains(r"[\sT]\d").any():
        # A time of day ("2006-11-07 15:00:00", "7/1/2020 1:31 PM", "2020-01-02T00:00:00+08:00"): read whole
        # or refused. A value with no clock ("Jan 02, 2024") stays whole and goes to the date formats.
        parts = text.str.extract_groups(_STAMP)
        has = parts.struct.field("clock").is_not_null()
        bad = text.str.contains(r"\d{1,2}:\d{2}") & ~has
        if bad.any():
            raise fail(uniq.filter(bad)[0], "a time of day HH:MM[:SS] [AM|PM] [Z|+HH:MM]")
        clock = parts.struct.unnest()
        text = pl.select(pl.when(has).then(clock["date"]).otherwise(text)).to_series()
    if text.len() == 0:
        raise InputError(f"{path}: date column {name!r} is empty")
    sample = text.head(1000)
    fmt = next((f for f in columns.DATE_FORMATS if sample.str.to_date(f, strict=False).null_count() == 0), None)
    if fmt is None:
        # No single format fits: name a value no format reads, or two values in different formats.
        fits = {f: sample.str.to_date(f, strict=False).is_not_null() for f in columns.DATE_FORMATS}
        for i in range(sample.len()):
            if not any(fits[f][i] for f in fits):
                raise fail(uniq[i], EXPECTED)
        first = next(f for f in columns.DATE_FORMATS if fits[f][0])
        j = int((~fits[first]).arg_max())
        a, b = uniq[0], uniq[j]
        raise InputError(f"{path}: mixed date formats in column {name!r}: {a!r} ({line((raw == a).arg_max())})"
                         f" and {b!r} ({line((raw == b).arg_max())}); use one format per file")
    out = text.str.to_date(fmt, strict=False)
    if out.null_count():
        raise fail(uniq.filter(out.is_null())[0], f"expected format {fmt}")
    stamp = out.cast(TIME)
    if clock is not None:
        stamp = _with_clock(stamp, clock, uniq, fail, raw, line, path, name)
    return stamp


def _with_clock(stamp: pl.Series, clock: pl.DataFrame, uniq: pl.Series, fail: Callable[[object, str], InputError],
                raw: pl.Series, line: Line, path: Path, name: str) -> pl.Series:
    """Add the time of day (12-hour clocks with AM/PM) and convert UTC offsets to the exchange's clock."""
    hms = clock["clock"].fill_null("00:00").str.split(":")
    h, m = hms.list.get(0).cast(pl.Int64), hms.list.get(1).cast(pl.Int64)
    ampm = clock["ampm"].str.to_uppercase()
    twelve = ampm.is_not_null()
    if ((h > 24) | (m > 59) | (twelve & ((h < 1) | (h > 12)))).any():
        raise fail(uniq.filter((h > 24) | (m > 59) | (twelve & ((h < 1) | (h > 12))))[0],
                   "a time of day HH:MM[:SS], or 1..12 with AM/PM")
    h = pl.select(pl.when(twelve).then(h % 12 + pl.when(ampm == "PM").then(12).otherwise(0)).otherwise(h)
                  ).to_series()
    # a fraction of a second is kept (in ms): a minute file then refuses it, or rounds it with --round-stamps
    ms = (hms.list.get(2, null_on_oob=True).cast(pl.Float64).fill_null(0) * 1000).round(0).cast(pl.Int64)
    secs = h * 3600 + m * 60 + ms // 1000
    if (secs > 86400).any():
        raise fail(uniq.filter(secs > 86400)[0], "a time of day HH:MM[:SS]")
    wall = stamp.cast(pl.Int64) + (h * 3600 + m * 60) * 1000 + ms
    zone = clock["zone"]
    if zone.is_null().all():
        return wall.cast(TIME)
    offset = _offset_minutes(zone)
    tz = ZONE.get()
    if tz is None:
        kinds = offset.fill_null(-1 << 20)
        if kinds.n_unique() > 1:
            a, b = uniq[0], uniq[int((kinds != kinds[0]).arg_max())]
            raise InputError(f"{path}: stamps with different UTC offsets in column {name!r}: {a!r} "
                             f"({line((raw == a).arg_max())}) and {b!r} ({line((raw == b).arg_max())}); pass "
                             f"--timezone (the exchange's, e.g. Asia/Shanghai) to convert them to its clock")
        return wall.cast(TIME)   # one offset throughout: its wall clock is the exchange's
    utc = (wall - offset.fill_null(0) * 60_000).cast(pl.Datetime("ms", "UTC"))
    local = utc.dt.convert_time_zone(tz).dt.replace_time_zone(None).cast(TIME)
    out = pl.select(pl.when(offset.is_null()).then(wall.cast(TIME)).otherwise(local)).to_series()
    _note_moved(out, stamp, uniq, raw, line, path)
    return out


def _note_moved(out: pl.Series, written: pl.Series, uniq: pl.Series, raw: pl.Series, line: Line, path: Path) -> None:
    """Record the stamps the conversion moved to another date than the one written (reported for daily stores:
    ``2000-01-04 00:00:00+09:00`` is 2000-01-03 15:00 UTC)."""
    acc = MOVED.get()
    moved = (out.dt.date() != written.dt.date()).fill_null(False)
    if acc is None or not moved.any():
        return
    j = int(moved.arg_max())
    n = int(raw.is_in(uniq.filter(moved).implode()).sum()) if raw.dtype == uniq.dtype else int(moved.sum())
    acc[(str(path), line(0))] = (n, str(uniq[j]), f"{path}: {line((raw == uniq[j]).arg_max())}", str(out[j]))


def moved_note(moved: dict, tz: str | None) -> str | None:
    """One line for a daily store whose bars the conversion to ``tz`` moved to other dates, else None."""
    if not moved:
        return None
    n = sum(v[0] for v in moved.values())
    _, value, where, local = next(iter(moved.values()))
    return (f"--timezone {tz}: {n} bar(s) stored on another date than written: their stamps with a UTC offset "
            f"converted to {tz}'s clock fall on another day, e.g. {value!r} ({where}) is {local[:16]} there, a bar "
            f"of {local[:10]}; daily stamps at local midnight are dates: leave --timezone out to keep them")


def _offset_minutes(zone: pl.Series) -> pl.Series:
    """``Z``/``UTC``/``GMT`` -> 0, ``+08:00``/``+0800``/``+08`` -> 480, ``-05:30`` -> -330; null stays null."""
    z = zone.str.to_uppercase().str.replace(r"^(Z|UTC|GMT)$", "+00:00").str.replace(":", "")
    sign = pl.select(pl.when(z.str.slice(0, 1) == "-").then(-1).otherwise(1)).to_series()
    hh = z.str.slice(1, 2).cast(pl.Int64)
    mm = z.str.slice(3, 2).replace("", None).cast(pl.Int64).fill_null(0)
    return (sign * (hh * 60 + mm)).alias("offset")


def check_timezone(tz: str | None) -> str | None:
    """An IANA time zone name (``Asia/Shanghai``), or None; InputError for an unknown one."""
    if tz is None:
        return None
    try:
        ZoneInfo(str(tz))
        pl.Series([0]).cast(pl.Datetime("ms", "UTC")).dt.convert_time_zone(str(tz))
    except Exception:   # zoneinfo and polars raise several kinds; all mean "not a zone"
        raise InputError(f"--timezone {tz!r}: not a time zone name (e.g. Asia/Shanghai, America/New_York)") from None
    return str(tz)


@contextmanager
def exchange_zone(tz: str | None) -> Iterator[dict]:
    """Within: stamps with a UTC offset (and zone-aware Parquet columns) are converted to ``tz``'s clock. Yields
    where the conversion moved stamps to another date (text stamps with an offset; see :func:`moved_note`)."""
    token = ZONE.set(check_timezone(tz))
    moved: dict = {}
    token_moved = MOVED.set(moved)
    try:
        yield moved
    finally:
        MOVED.reset(token_moved)
        ZONE.reset(token)


def integral_float_dates(raw: pl.Series, path: Path, column: str, line: Line) -> pl.Series:
    """YYYYMMDD (or YYYYMMDDHHMM[SS]) written as floats (``19991110.0``: pandas writes an int column so once it
    held a NaN) as the integers they are; any other column as it is. Text only: a float-typed column is parsed as numbers.

    Raises:
        InputError: a column of such floats holds one with a fraction (``20240103.5``), named with its line.
    """
    if raw.dtype != pl.String:
        return raw
    text = raw.str.strip_chars()
    text = pl.when(text.is_in(columns.NULL_VALUES)).then(None).otherwise(text)   # "nan", "NA": missing, named later
    text = pl.select(text.alias(raw.name)).to_series()
    cells = text.drop_nulls()
    if cells.len() == 0 or not cells.str.contains(r"^(\d{8}|\d{12}|\d{14})\.\d*$").all():
        return raw
    whole = text.str.contains(r"^\d+\.0*$")
    if not whole.fill_null(True).all():
        i = int((~whole.fill_null(True)).arg_max())
        raise InputError(f"{path}: {line(i)}: unparseable date {columns.short(raw[i])} in column {column!r} "
                         f"(a YYYYMMDD number with a fraction)")
    return text.str.replace(r"\.0*$", "").cast(pl.Int64)
