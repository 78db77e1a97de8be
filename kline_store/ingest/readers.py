"""Read one input file (CSV in UTF-8 or GBK/GB18030, or Parquet) into normalised polars frames, a chunk at a time.

Output columns: ``_row`` (0-based data row, for messages), ``symbol`` (str), ``date`` (local timestamp,
pl.Datetime), and one Float32 column per canonical field (plus Yahoo's derived ``adj_factor``, see adjust.py).

polars' streaming engine reads the file, on its own threads, a bounded number of rows at a time (memory bounded
whatever the file size; a small file comes as one chunk). Beside it, in a thread, a CSV's whole-file checks run
(textscan.scan: the field count of every line, and the encoding past the first block): an error they find wins
over anything the parse finds, as if they had come first, and a small file's chunk waits for them. Numbers are
parsed by polars' typed reader (fast path); only when that fails is the file read again as text, to name the
exact line, column and value, or to read words that mean "missing".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import polars as pl

from . import adjust, clock, columns, textscan
from .dates import FIRST_DAY, LAST_DAY, TIME, integral_float_dates, parse_dates, temporal, with_format
from .. import memory
from ..errors import InputError
from .inputs import is_parquet, line_shift, location, symbol_from_name
from .sources import YYYYMMDD, Source, _one_line, _scan, inspect_source, sniff_date_format

__all__ = ["CHUNK_BYTES", "WHOLE_FILE", "Reread", "Source", "finish_values", "inspect_source", "iter_chunks",
           "read_source", "sniff_date_format"]

CHUNK_BYTES = 16 << 20   # bytes (CSV text, Parquet values) read at a time from big files: bounds memory
# polars' streaming CSV reader parses the text in pieces of this size (its default grows with the file: a 750 MiB
# file held 400 MiB of pieces in flight); the user's own POLARS_CSV_CHUNK_SIZE wins.
CSV_PIECE = 4 << 20
WHOLE_FILE = 256 << 20   # files up to this size are read as one chunk (a caller may lower it, see ``whole``)
# Every column of a CSV is parsed, no projection: polars rejects a line with more fields than the header only then.
ALL_COLUMNS = pl.QueryOptFlags(projection_pushdown=False)
STREAM_MEMORY = 2 << 30  # a big Parquet file is read in slices when less memory than this is available


class Reread(Exception):
    """The file must be read again from its start as ``source`` says; the chunks already handed out, if any, are
    void (its text turned out to be GB18030, or its numbers need the text path)."""

    def __init__(self, source: Source) -> None:
        super().__init__(str(source.path))
        self.source = source


def _float_exprs(src: Source, text_only: bool) -> list[pl.Expr]:
    out = []
    for s, d in src.value_columns.items():
        e = pl.col(s)
        if text_only:
            # Text cells are stripped and read leniently (the text path has named any bad cell already).
            e = e.cast(pl.String).str.strip_chars().cast(pl.Float64, strict=False)
        out.append(e.cast(pl.Float64).alias(d))
    return out


def read_source(src: Source) -> pl.DataFrame:
    """All rows of one file as one normalised frame (see :func:`iter_chunks`)."""
    while True:
        try:
            chunks = list(iter_chunks(src))
            break
        except Reread as again:
            src = again.source
    return chunks[0] if len(chunks) == 1 else pl.concat(chunks)


def iter_chunks(src: Source, chunk_bytes: int = CHUNK_BYTES, done: Callable[[float], None] | None = None,
                whole: int | None = None, extra: dict[str, pl.Expr] | None = None, settle: int | None = None
                ) -> Iterator[pl.DataFrame]:
    """The rows of one file, normalised, in chunks of about ``chunk_bytes`` (one chunk for small files).

    Columns: ``_row`` (0-based data row), ``symbol``, ``date`` (local timestamp), canonical fields as Float32.
    Errors name file, line (row), column and value.

    ``done``: called with the share of the file read so far (0..1) after each chunk, for progress;
    ``whole``: files up to this many bytes (default WHOLE_FILE) are read as one chunk;
    ``extra``: columns to compute as the file is read (over the normalised values, before any row is dropped);
    ``settle``: a CSV up to this many bytes (default ``whole``) is checked whole before its first chunk is handed
    out (so an error there comes before any chunk); a bigger one's checks end while its chunks come.

    Raises:
        InputError: the file is not readable bars, said in one line.
        Reread: the file must be read again as the exception's source says (its text is GB18030, or after
            chunks were handed out, its numbers need the text path).
    """
    whole = WHOLE_FILE if whole is None else whole
    return _read(src, chunk_bytes, done, whole, True, extra or {}, whole if settle is None else settle)


def _read(src: Source, chunk_bytes: int, done: Callable[[float], None] | None, whole: int, checks: bool,
          extra: dict[str, pl.Expr], settle: int) -> Iterator[pl.DataFrame]:
    size = _size(src)
    rows = None if size <= max(chunk_bytes, whole) else max(1, int(chunk_bytes / max(src.row_bytes, 1.0)))
    first_waits = rows is None or size <= settle
    check = _start_checks(src) if checks else None
    n = 0
    try:
        try:
            for df in _frames(src, rows, extra):
                if first_waits and check is not None:
                    again = _settle(check, src)     # a small file waits for the checks: theirs is the first word
                    check = None
                    if again is not None:
                        raise Reread(again)
                if df.height:
                    n += df.height
                    last = int(df["_row"][-1]) + 1
                    yield _finish_chunk(df, src)
                    if done is not None:
                        done(1.0 if rows is None else min(1.0, last * src.row_bytes / max(size, 1)))
        except (pl.exceptions.PolarsError, InputError) as exc:
            again = _settle(check, src)
            check = None
            if again is not None:
                raise Reread(again) from None
            if isinstance(exc, InputError):
                raise
            if not src.typed:
                raise InputError(f"{src.path}: cannot read ({_one_line(exc)})") from None
            _explain_bad_value(src)          # raises with the exact line; returns if polars' error was elsewhere
            text = dataclasses.replace(src, typed=False)
            if n:
                raise Reread(text) from None
            yield from _read(text, chunk_bytes, done, whole, False, extra, settle)
            return
        again = _settle(check, src)
        if again is not None:
            raise Reread(again)
    except OSError as exc:
        raise InputError(f"{src.path}: cannot read ({_one_line(exc)})") from None
    finally:
        if check is not None:
            check.cancel()
    if done is not None:
        done(1.0)
    if n == 0:
        raise InputError(f"{src.path}: no data rows")


def _size(src: Source) -> int:
    return len(src.data) if src.data is not None else os.path.getsize(src.path)


def _start_checks(src: Source) -> textscan.Background | None:
    """The whole-file checks of a CSV, started in a thread: field counts, and UTF-8 when not settled yet."""
    if is_parquet(src.path):
        return None
    return textscan.Background(functools.partial(textscan.scan, first_line=1 + line_shift(src.path)), src.path,
                               src.data, src.separator, len(src.columns), not src.settled)


def _settle(check: textscan.Background | None, src: Source) -> Source | None:
    """Wait for the checks: raise the InputError they found; the source read as GB18030 when it is not UTF-8."""
    if check is None or check.result():
        return None
    return dataclasses.replace(src, data=textscan.gb18030(src.path), encoding="gb18030", settled=True)


def _frames(src: Source, rows: int | None, extra: dict[str, pl.Expr]) -> Iterator[pl.DataFrame]:
    """The file's rows, selected and typed by polars: all at once (``rows`` None) or ``rows`` at a time."""
    symbol = symbol_from_name(src.path, src.symbol_pattern)
    sym_expr = (pl.col(src.symbol_column).cast(pl.String).str.strip_chars()
                if src.symbol_column else pl.lit(symbol, dtype=pl.String)).alias("symbol")
    fmt = sniff_date_format(src) if src.typed else None
    keep = [pl.col("_row"), sym_expr, pl.col(src.date_column).alias("_date_raw")]
    fast = _fast_date(src, fmt) if src.date_format is None else _formatted(src)
    if fast is not None:
        keep.append(fast.alias("_date_fast"))
    if src.time_column is not None:
        keep.append(pl.col(src.time_column).alias("_time_raw"))
    lf = finish_values(_scan(src, text_only=not src.typed, date_fmt=fmt).select(
        *keep, *_float_exprs(src, text_only=not src.typed)), src)
    lf = lf.with_columns(_row_checks(src), *[e.alias(name) for name, e in extra.items()])
    if is_parquet(src.path):
        if rows is None:
            yield lf.collect(engine="streaming")
        elif memory.available().nbytes < STREAM_MEMORY:
            yield from _parquet_slices(lf, src.path, rows)
        else:
            yield from lf.collect_batches(chunk_size=rows)
        return
    with _csv_pieces():
        if rows is None:
            yield lf.collect(engine="streaming", optimizations=ALL_COLUMNS)
        else:
            yield from lf.collect_batches(chunk_size=rows, optimizations=ALL_COLUMNS)


def _fast_date(src: Source, fmt: str | None) -> pl.Expr | None:
    """The stamps as polars reads them, for dates of a form it parses as dates.parse_dates would (null where a
    cell is not of that form: _fast_dates then leaves the chunk to parse_dates); None for the other forms."""
    date = pl.col(src.date_column)
    if src.time_column is not None:    # a stamp joined from two columns: clock.py, after the read
        return None
    if src.date_column in src.schema:  # a Parquet date or timestamp column
        return temporal(date, src.schema[src.date_column])
    if fmt == YYYYMMDD:                # read as integers: a date of their digits
        return date.cast(pl.String).str.to_date("%Y%m%d", strict=False).cast(TIME)
    if fmt is not None:
        return date.str.to_date(fmt, strict=False).cast(TIME) if "%H" not in fmt else \
            date.str.strptime(TIME, fmt, strict=False)
    return None


def _formatted(src: Source) -> pl.Expr | None:
    """--date-format: the date column (a time column joined to it with a space) read with the user's format by
    polars as it reads the file (null where a cell does not match: _finish_chunk names it); a Parquet date or
    timestamp column is read as it is."""
    if src.date_column in src.schema and temporal(pl.col(src.date_column), src.schema[src.date_column]) is not None:
        return _fast_date(src, None)
    text = pl.col(src.date_column).cast(pl.String).str.strip_chars()
    if src.time_column is not None:
        text = pl.concat_str([text, pl.col(src.time_column).cast(pl.String).str.strip_chars()], separator=" ")
    return with_format(text, src.date_format or "")


def _parquet_slices(lf: pl.LazyFrame, path: Path, rows: int) -> Iterator[pl.DataFrame]:
    """A big Parquet file about ``rows`` rows at a time, in whole row groups, the next slice read in the
    background while the caller works on this one: two slices in memory (polars' streaming reader, faster,
    decodes row groups ahead of a slower consumer: up to 400 MiB in flight)."""
    import pyarrow.parquet as pq   # a dependency; its metadata tells the row groups

    meta = pq.ParquetFile(path).metadata
    cuts, run = [0], 0
    for i in range(meta.num_row_groups):
        run += meta.row_group(i).num_rows
        if run - cuts[-1] >= rows or i == meta.num_row_groups - 1:
            cuts.append(run)
    parts = [(a, b - a) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    pending = lf.slice(*parts[0]).collect(background=True) if parts else None
    for k in range(len(parts)):
        now, pending = pending, (lf.slice(*parts[k + 1]).collect(background=True) if k + 1 < len(parts) else None)
        yield now.fetch_blocking()


@contextlib.contextmanager
def _csv_pieces() -> Iterator[None]:
    """POLARS_CSV_CHUNK_SIZE set to CSV_PIECE while a CSV is read, unless the user set it."""
    if "POLARS_CSV_CHUNK_SIZE" in os.environ:
        yield
        return
    os.environ["POLARS_CSV_CHUNK_SIZE"] = str(CSV_PIECE)
    try:
        yield
    finally:
        os.environ.pop("POLARS_CSV_CHUNK_SIZE", None)


def _row_checks(src: Source) -> pl.Expr:
    """Per row, as polars reads it: 1 a blank line (every cell empty: no row at all, as a spreadsheet's trailing
    empty line), 2 no symbol, 4 an infinite value."""
    values = src.fields
    blank = pl.all_horizontal([pl.col("_date_raw").is_null(), *[pl.col(c).is_null() for c in values]])
    no_symbol = pl.lit(False)
    if src.symbol_column:
        no_symbol = pl.col("symbol").is_null() | (pl.col("symbol") == "")
        blank = blank & no_symbol
    inf = pl.any_horizontal([pl.col(c).is_infinite() for c in values] or [pl.lit(False)])
    return (blank.cast(pl.UInt8) + (no_symbol & ~blank).cast(pl.UInt8) * 2
            + inf.fill_null(False).cast(pl.UInt8) * 4).alias("_checks")


def _finish_chunk(df: pl.DataFrame, src: Source) -> pl.DataFrame:
    values = src.fields
    checks = df["_checks"].to_numpy()
    seen = int(np.bitwise_or.reduce(checks)) if len(checks) else 0   # rows looked at only when one has something
    df = without(df, "_checks")
    if seen & 1:
        df = df.filter(pl.Series((checks & 1) == 0))
    if seen & 2:
        empty = df["symbol"].is_null() | (df["symbol"] == "")
        i = empty.arg_max()
        raise InputError(f"{src.where(df['_row'][i])}: empty symbol in column {src.symbol_column!r}")
    for c in values if seen & 4 else ():
        inf = df[c].is_infinite()
        if inf.any():
            i = inf.arg_max()
            raise InputError(f"{src.where(df['_row'][i])}: column {c!r}: infinite value")
    if src.date_format is not None:
        return _formatted_dates(df, src)
    fast = _fast_dates(df)
    if fast is not None:
        return without(df.with_columns(fast), "_date_raw", "_date_fast")
    rows = df["_row"]

    def where(i: int) -> str:
        return location(src.path, rows[int(i)])

    raw = integral_float_dates(df["_date_raw"], src.path, src.date_column, where)
    if "_time_raw" in df.columns:
        empty = clock.empty_times(raw, df["_time_raw"])
        if empty is not None:   # a minute file's row without its time: never a bar at 00:00
            i = int(empty.arg_max())
            if not src.skip_bad:
                raise InputError(f"{src.where(rows[i])}: column {src.time_column!r} is empty beside date "
                                 f"{columns.short(raw[i])}: a bar needs its time of day (fix the file, or pass "
                                 f"--skip-bad to leave such rows out)")
            src.empty_times.extend(rows.filter(empty).to_list())
            keep = ~empty
            df, raw = df.filter(keep), raw.filter(keep)
            rows = df["_row"]
        raw = clock.join_stamp(raw, df["_time_raw"], src.path, src.time_column or "time", where)
        df = without(df, "_time_raw")
    dates = parse_dates(raw, src.path, src.date_column, where)
    return without(df.with_columns(dates), "_date_raw", *(["_date_fast"] if "_date_fast" in df.columns else []))


def _formatted_dates(df: pl.DataFrame, src: Source) -> pl.DataFrame:
    """The stamps read with --date-format; a cell that does not match it, or a date outside FIRST_DAY..LAST_DAY,
    is one line naming the file, line, column and value."""
    fast = df["_date_fast"]
    if fast.null_count():
        i = int(fast.is_null().arg_max())
        raw = df["_date_raw"][i]
        cell = "" if raw is None else str(raw).strip()
        if "_time_raw" in df.columns and df["_time_raw"][i] is not None:
            cell = f"{cell} {str(df['_time_raw'][i]).strip()}"
        what = (f"date {columns.short(cell)} in column {src.date_column!r} does not match --date-format "
                f"{src.date_format!r}" if cell else f"missing date in column {src.date_column!r}")
        raise InputError(f"{src.where(df['_row'][i])}: {what}")
    if fast.len():
        lo = FIRST_DAY.astype("datetime64[ms]").item()
        hi = (LAST_DAY + 1).astype("datetime64[ms]").item()
        out = (fast < lo) | (fast >= hi)
        if out.any():
            i = int(out.arg_max())
            raise InputError(f"{src.where(df['_row'][i])}: date {columns.short(str(df['_date_raw'][i]))} read with "
                             f"--date-format {src.date_format!r} is {fast[i]}, outside {FIRST_DAY}..{LAST_DAY}")
    return without(df.with_columns(fast.alias("date")), "_date_raw", "_date_fast",
                   *(["_time_raw"] if "_time_raw" in df.columns else []))


def without(df: pl.DataFrame, *names: str) -> pl.DataFrame:
    """``df`` less some columns, without a copy: ``DataFrame.drop`` goes through a lazy plan that joins the
    chunks of every column a streaming read left (1.4 ms for a chunk of 230k rows; this: microseconds)."""
    out = df.clone()   # shallow: the columns are shared
    for name in names:
        out.drop_in_place(name)
    return out


def _fast_dates(df: pl.DataFrame) -> pl.Series | None:
    """The stamps polars parsed while reading (sources.FAST_FORMATS), when every cell parsed and lies within
    FIRST_DAY..LAST_DAY; None sends the chunk to dates.parse_dates (which names what is wrong)."""
    if "_date_fast" not in df.columns:
        return None
    fast = df["_date_fast"]
    if fast.null_count() or not fast.len():
        return None
    lo, hi = fast.min(), fast.max()
    if lo < FIRST_DAY.astype("datetime64[ms]").item() or hi >= (LAST_DAY + 1).astype("datetime64[ms]").item():
        return None
    return fast.alias("date")


def finish_values(lf: pl.LazyFrame, src: Source) -> pl.LazyFrame:
    """Add Yahoo's factor (adj_close / close, in float64) and cast every value to float32 as stored."""
    lf, canon = adjust.with_input_factor(lf, list(src.value_columns.values()))
    # A NaN cell is a missing value, like an empty one ("NaN" text, or pandas' NaN in Parquet).
    return lf.with_columns([pl.col(c).fill_nan(None).cast(pl.Float32) for c in canon])


def _explain_bad_value(src: Source) -> None:
    """Read the file as text, a chunk at a time; raise InputError naming the first non-numeric cell of the first
    column (in the file's order) that has one. Returns when there is none."""
    first: dict[str, tuple[int, str]] = {}
    try:
        lf = _scan(src, text_only=True)
        for df in lf.collect_batches(chunk_size=max(1, int(CHUNK_BYTES / max(src.row_bytes, 1.0))),
                                     optimizations=ALL_COLUMNS):
            for s in src.value_columns:
                col = df[s]
                if s in first or col.dtype != pl.String:
                    continue
                parsed = col.str.strip_chars().cast(pl.Float64, strict=False)
                bad = parsed.is_null() & col.is_not_null()
                if bad.any():
                    i = bad.arg_max()
                    first[s] = (int(df["_row"][i]), col[i])
            if next(iter(src.value_columns), None) in first:
                break                        # the first column's first bad cell: nothing can come before it
    except pl.exceptions.PolarsError as exc:
        if not is_parquet(src.path):        # most likely a line with more fields: name it
            textscan.exact_lines(np.frombuffer(src.data, np.uint8) if src.data is not None
                                 else textscan.map_file(src.path), src.separator, len(src.columns), src.path,
                                 1 + line_shift(src.path))
        raise InputError(f"{src.path}: cannot parse ({_one_line(exc)})") from None
    for s in src.value_columns:
        if s in first:
            row, value = first[s]
            cell = str(value).strip()
            hint = (f" (a missing-value marker? pass --na {cell!r})"
                    if 0 < len(cell) <= 6 and not any(ch.isdigit() for ch in cell) else "")
            raise InputError(f"{src.where(row)}: column {columns.short(s)}: non-numeric value "
                             f"{columns.short(value)}{hint}")
