"""Read one input file (CSV in UTF-8 or GBK/GB18030, or Parquet) into normalised polars frames.

Output columns: ``_row`` (0-based data row, for messages), ``symbol`` (str), ``date`` (local timestamp, pl.Datetime), and one
Float32 column per canonical field (plus Yahoo's derived ``adj_factor``, see adjust.py). A CSV is checked
whole before it is parsed: its encoding (textscan.detect_encoding) and the field count of every line
(textscan.check_lines). Numeric cells are parsed by polars' CSV reader (fast path); only when that fails is
the file re-read as text to name the exact line, column and value.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import polars as pl

from . import adjust, clock, columns as C, packed, textscan
from .dates import integral_float_dates, parse_dates
from ..errors import InputError
from .inputs import FixedSymbol, is_parquet, location, symbol_from_name

CHUNK_BYTES = 32 << 20   # CSV bytes parsed at a time for big files: bounds memory whatever the file size
WHOLE_FILE = 256 << 20   # files up to this size are parsed in one go (fastest: polars' parallel reader)
MAX_HEADER = 16 << 20    # a header line longer than this is not a header


@dataclass
class Source:
    """What is known about one input file before its rows are read."""

    path: Path
    columns: list[str]          # header as in the file
    mapping: dict[str, str]     # source column -> canonical name
    data: bytes | None          # re-encoded UTF-8 bytes for non-UTF-8 CSVs, else None (read from path)
    encoding: str
    separator: str = ","
    dropped: list[str] = field(default_factory=list)  # extra text columns (names, industries) left out
    symbol_pattern: str | None = None                    # regex for the symbol in the file name
    head: pl.DataFrame | None = None                     # first rows as text (see _head)
    na: tuple[str, ...] = ()                             # --na: the vendor's own missing-value markers

    @property
    def symbol_column(self) -> str | None:
        return next((s for s, d in self.mapping.items() if d == "symbol"), None)

    @property
    def date_column(self) -> str:
        return next(s for s, d in self.mapping.items() if d == "date")

    @property
    def time_column(self) -> str | None:
        """A time-of-day column read with the date column as one stamp (clock.py), if the file has one."""
        return next((s for s, d in self.mapping.items() if d == "time"), None)

    @property
    def value_columns(self) -> dict[str, str]:
        return {s: d for s, d in self.mapping.items() if d not in ("symbol", "date", "time")}

    @property
    def fields(self) -> list[str]:
        """The canonical fields this file's frames carry (Yahoo's derived factor included)."""
        canon = list(self.value_columns.values())
        return canon + [adjust.FACTOR] if adjust.derives_factor(canon) else canon

    def where(self, row: int) -> str:
        return f"{self.path}: {location(self.path, row)}"


def _sniff_separator(first_line: str) -> str:
    counts = {sep: first_line.count(sep) for sep in (",", "\t", ";", "|")}
    return max(counts, key=counts.get) if max(counts.values()) else ","


def inspect_source(path: Path, user_map: dict[str, str] | None = None, symbol_pattern: str | None = None,
                   na: tuple[str, ...] = ()) -> Source:
    """Read the header of ``path`` and resolve its columns; raise InputError if date or close is missing."""
    schema: dict[str, pl.DataType] = {}
    try:
        if is_parquet(path):
            with open(path, "rb") as fh:   # a file object: polars would expand * or [ ] in a name
                schema = dict(pl.read_parquet_schema(fh))
            cols = list(schema)
            enc, data, sep = "parquet", None, ","
        else:
            if os.path.getsize(path) == 0:
                raise InputError(f"{path}: file is empty")
            unpacked = packed.read(path)   # .csv.gz, .csv.zst, a .zip of one CSV: decompressed in memory
            enc, data = unpacked if unpacked is not None else textscan.detect_encoding(path)
            text = _first_line(path, data).decode("utf-8", "replace")
            first = text.lstrip("\ufeff").splitlines()[0] if text.strip() else ""
            if not first.strip():
                raise InputError(f"{path}: file is empty")
            sep = _sniff_separator(first)
            cols = _header(first, sep)
    except InputError:
        raise
    except Exception as exc:  # unreadable parquet footer, permission denied, ...
        raise InputError(f"{path}: cannot read ({_one_line(exc)})") from None
    mapping = C.resolve_columns(cols, user_map)
    src = Source(path, cols, mapping, data, enc, sep, symbol_pattern=symbol_pattern, na=tuple(na))
    unnamed = [c for c in cols if C.is_index_name(c) and c not in (user_map or {})]
    if "date" not in mapping.values() and unnamed:
        # pandas writes its index unnamed: to_csv() as the first column, to_parquet() as __index_level_0__
        src.head = _head(src)
        found = next((c for c in unnamed if _are_dates(src.head, c, path)), None)
        if found is not None:
            src.mapping = mapping = {found: "date", **mapping}
    canon = set(mapping.values())
    if isinstance(symbol_pattern, FixedSymbol) and src.symbol_column:
        raise InputError(f"{path}: symbol {str(symbol_pattern)!r} given, but the input has a symbol column "
                         f"{src.symbol_column!r}; leave the symbol out")
    if not src.symbol_column:
        symbol_from_name(path, symbol_pattern)   # a pattern that does not match: say so before reading
    if "date" not in canon:
        raise InputError(C.describe_missing("date", cols, str(path)))
    if "close" not in canon:
        raise InputError(C.describe_missing("close", cols, str(path)))
    if list(mapping.values()).count("time") > 1:
        raise InputError(f"{path}: more than one time-of-day column: "
                         f"{', '.join(s for s, d in mapping.items() if d == 'time')}; map one of them")
    forced = set(user_map or {})
    dropped = _unusable_types(src, schema, forced) if schema else []
    for col in dropped:
        del mapping[col]
    if src.head is None:
        src.head = _head(src)
    tcol = src.time_column
    if tcol is not None and src.head is not None and tcol not in forced and clock.holds_dates(src.head[tcol]):
        # tushare's trade_time holds the whole stamp: it is the date column; the date-only one is left out
        dropped.append(src.date_column)
        del mapping[src.date_column]
        mapping[tcol] = "date"
    text = _text_extras(src, forced)
    for col in text:
        del mapping[col]
    dropped += text
    # A second column for the same field ("Date" beside "date", "code" beside "ts_code") is left out: say so.
    for c in [c for c in cols if re.search(r"_duplicated_\d+$", c) and c in mapping]:
        del mapping[c]   # polars' name for a repeated header ("close,close"): the first one is the field
    shadowed = [c for c in cols if c not in mapping and not C.is_index_name(c) and c not in dropped]
    src.dropped = dropped + shadowed
    return src


def _are_dates(head: pl.DataFrame | None, column: str, path: Path) -> bool:
    """True when the first rows of ``column`` hold dates, and nothing else."""
    if head is None:
        return False
    try:
        cells = integral_float_dates(head[column], path, column, lambda i: location(path, int(i)))
        parse_dates(cells, path, column, lambda i: location(path, int(i)))
    except InputError:
        return False
    return cells.drop_nulls().len() > 0


def _first_line(path: Path, data: bytes | None) -> bytes:
    """The header line's bytes, however long (a wide pandas export can have thousands of columns)."""
    if data is not None:
        end = data.find(b"\n")
        return data if end < 0 else data[:end]
    out = b""
    with open(path, "rb") as fh:
        while b"\n" not in out:
            block = fh.read(1 << 16)
            if not block:
                break
            out += block
            if len(out) > MAX_HEADER:
                raise InputError(f"{path}: no line end in the first {MAX_HEADER >> 20} MiB: not a CSV file")
    return out.split(b"\n", 1)[0]


def _unusable_types(src: Source, schema: dict[str, pl.DataType], forced: set[str]) -> list[str]:
    """Parquet columns whose type cannot hold their field: an error for the fields kline-store needs (and
    for columns named in --map), left out (and reported) for extra columns."""
    out = []
    for s, d in src.mapping.items():
        dt = schema[s]
        if d == "symbol":
            ok = dt.is_integer() or dt in (pl.String, pl.Categorical) or isinstance(dt, pl.Enum)
        elif d in ("date", "time"):
            ok = dt.is_temporal() or dt.is_integer() or dt.is_float() or dt == pl.String
        else:
            ok = dt.is_numeric() or dt in (pl.String, pl.Null)
        if ok:
            continue
        if d in ("symbol", "date", "time") or d in C.BASE_FIELDS or s in forced:
            raise InputError(f"{src.path}: column {s!r} has type {dt}; {d} needs "
                             f"{'text' if d == 'symbol' else 'dates' if d == 'date' else 'numbers'}")
        out.append(s)
    return out


def _head(src: Source) -> pl.DataFrame | None:
    """The first rows as text: enough to tell text columns and the date form apart, read once.

    Parses the first 256 KiB only (polars would map the whole file to answer head() on a path).
    """
    try:
        if is_parquet(src.path):
            return _scan(src, text_only=True).head(1000).collect()
        if src.data is not None:
            first = src.data[: 256 << 10]
        else:
            with open(src.path, "rb") as fh:
                first = fh.read(256 << 10)
        if len(first) == 256 << 10:
            first = first[: first.rfind(b"\n") + 1]
        return _scan(src, text_only=True, data=first).head(1000).collect()
    except pl.exceptions.PolarsError:
        return None  # the full read will report what is wrong, with a line number


def _header(first: str, sep: str) -> list[str]:
    """Column names exactly as polars will name them (quotes removed, spaces kept)."""
    try:
        return pl.read_csv(io.BytesIO(first.encode() + b"\n"), separator=sep, n_rows=0,
                           infer_schema_length=0).columns
    except pl.exceptions.PolarsError:
        return [c.strip('"') for c in first.split(sep)]


def _text_extras(src: Source, forced: set[str]) -> list[str]:
    """Extra columns whose first rows hold no number at all: text such as names; they are not fields.

    Canonical fields and columns named in --map are never dropped: a bad value there is an error.
    """
    extras = [s for s, d in src.mapping.items()
              if d not in ("symbol", "date", "time") and d not in C.BASE_FIELDS and s not in forced]
    head = src.head
    if not extras or head is None:
        return []
    out = []
    for s in extras:
        col = head[s].cast(pl.String).str.strip_chars()
        if col.null_count() < col.len() and col.cast(pl.Float64, strict=False).null_count() == col.len():
            out.append(s)
    return out


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _scan(src: Source, text_only: bool, date_fmt: str | None = None, data: bytes | tuple[int, int] | None = None,
          row_offset: int = 0) -> pl.LazyFrame:
    """Lazy frame of the source's columns; numeric columns as Float64 unless ``text_only``.

    ``data``: CSV bytes to parse instead of the file (a piece of it); ``row_offset``: its first data row.
    """
    if is_parquet(src.path):
        lf = pl.scan_parquet(src.path, glob=False)   # a name may hold * or [ ]
        if isinstance(data, tuple):   # a slice of a big file (see _parquet_slices)
            lf = lf.slice(*data)
    else:
        overrides: dict[str, pl.DataType] = {c: pl.String for c in src.columns}
        if not text_only:
            for s in src.value_columns:
                overrides[s] = pl.Float64
            if date_fmt == "yyyymmdd-int":
                overrides[src.date_column] = pl.Int64
        data = data if data is not None else src.data
        source = io.BytesIO(data) if data is not None else src.path
        # The typed fast path leaves out the null literals (a 25% slower parse): a file that has them
        # ("null", "--", "NA") fails it and is read on the text path, which knows them.
        lf = pl.scan_csv(source, separator=src.separator, schema_overrides=overrides, infer_schema_length=0,
                         null_values=C.NULL_VALUES + list(src.na) if text_only else (list(src.na) or None),
                         glob=False)
    return lf.with_row_index("_row", offset=row_offset)


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
    chunks = list(iter_chunks(src))
    return chunks[0] if len(chunks) == 1 else pl.concat(chunks)


def iter_chunks(src: Source, chunk_bytes: int = CHUNK_BYTES, done: Callable[[float], None] | None = None,
                whole: int | None = None) -> Iterator[pl.DataFrame]:
    """The rows of one file, normalised, in chunks of bounded size (one chunk for small files).

    Columns: ``_row`` (0-based data row), ``symbol``, ``date`` (local timestamp), canonical fields as Float32.
    Fast path: a typed polars parse of each chunk of whole lines (big CSVs are cut at line ends, each piece
    parsed with the header in front). Only if it fails is the file re-read as text to find the offending
    cell, so errors name file, line, column and value.

    ``done``: called with the share of the file parsed so far (0..1) after each piece, for progress;
    ``whole``: files up to this many bytes are parsed in one piece (a smaller value makes progress move).
    """
    symbol = symbol_from_name(src.path, src.symbol_pattern)
    sym_expr = (pl.col(src.symbol_column).cast(pl.String).str.strip_chars()
                if src.symbol_column else pl.lit(symbol, dtype=pl.String)).alias("symbol")
    fmt = sniff_date_format(src)
    keep = [pl.col("_row"), sym_expr, pl.col(src.date_column).alias("_date_raw")]
    if src.time_column is not None:
        keep.append(pl.col(src.time_column).alias("_time_raw"))
    n = 0
    try:
        for piece, share in _pieces(src, chunk_bytes, whole):
            # Every column parsed, no projection: polars then rejects a line with more fields than the header
            # (textscan's count relies on it); the select runs on the frame in memory.
            parsed = _scan(src, text_only=False, date_fmt=fmt, data=piece, row_offset=n).collect()
            del piece
            df = finish_values(parsed.lazy().select(*keep, *_float_exprs(src, text_only=False)), src).collect()
            del parsed
            if df.height:
                n += df.height
                yield _finish_chunk(df, src)
            if done is not None:
                done(share)
    except pl.exceptions.PolarsError:
        if n:
            raise _explain_or_generic(src) from None
        text = _explain_bad_value(src)  # raises with the exact line; returns only if polars' error was elsewhere
        try:
            df = finish_values(text.lazy().select(*keep, *_float_exprs(src, text_only=True)), src).collect()
        except pl.exceptions.PolarsError as exc:
            raise InputError(f"{src.path}: cannot read ({_one_line(exc)})") from None
        n = df.height
        if n:
            yield _finish_chunk(df, src)
    except OSError as exc:
        raise InputError(f"{src.path}: cannot read ({_one_line(exc)})") from None
    if n == 0:
        raise InputError(f"{src.path}: no data rows")


def _pieces(src: Source, chunk_bytes: int, whole: int | None = None
            ) -> Iterator[tuple[bytes | tuple[int, int] | None, float]]:
    """CSV bytes with the header line in front, cut at line ends, about ``chunk_bytes`` each, each piece's
    field counts checked before it is handed out (textscan.check_lines); with each, the share of the file read.

    Yields None once for Parquet and for files up to ``whole`` bytes: polars reads those whole.
    """
    if is_parquet(src.path):
        yield from _parquet_slices(src.path, chunk_bytes)
        return
    n_fields = len(src.columns)
    size = len(src.data) if src.data is not None else os.path.getsize(src.path)
    if size <= max(chunk_bytes, WHOLE_FILE if whole is None else whole):
        buf = src.data if src.data is not None else textscan.map_file(src.path)
        textscan.check_lines(buf, src.separator, n_fields, src.path)
        del buf
        yield src.data, 1.0
        return
    with (io.BytesIO(src.data) if src.data is not None else open(src.path, "rb")) as fh:
        header = fh.readline()
        line = 2
        carry = b""
        read = len(header)
        while True:
            block = fh.read(chunk_bytes)
            data = memoryview(carry + block if carry else block)
            if not block:
                if len(data):
                    textscan.check_lines(data, src.separator, n_fields, src.path, line)
                    yield b"".join((header, data)), 1.0
                return
            cut = bytes(data[-65536:]).rfind(b"\n")
            if cut < 0:                       # a line longer than 64 KiB: read on
                carry = bytes(data)
                continue
            cut += len(data) - min(len(data), 65536) + 1
            carry = bytes(data[cut:])
            line += textscan.check_lines(data[:cut], src.separator, n_fields, src.path, line)
            read += cut
            yield b"".join((header, data[:cut])), min(1.0, read / max(size, 1))   # the one copy of each piece


PARQUET_WHOLE = 64 << 20   # Parquet files up to this size on disk are read in one go


def _parquet_slices(path: Path, chunk_bytes: int) -> Iterator[tuple[tuple[int, int] | None, float]]:
    """None (read it whole) for a small Parquet file, else ``(first row, rows)`` slices of about
    ``chunk_bytes`` of decoded values each: the file's row groups are decoded a slice at a time."""
    import pyarrow.parquet as pq   # pyarrow is a dependency; imported here to keep CSV-only runs light

    if os.path.getsize(path) <= PARQUET_WHOLE:
        yield None, 1.0
        return
    meta = pq.ParquetFile(path).metadata
    rows = meta.num_rows
    decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    per_slice = max(1, int(rows * chunk_bytes / max(decoded, 1)))
    for lo in range(0, rows, per_slice):
        yield (lo, min(per_slice, rows - lo)), min(rows, lo + per_slice) / rows


def _explain_or_generic(src: Source) -> InputError:
    try:
        _explain_bad_value(src)
    except InputError as exc:
        return exc
    return InputError(f"{src.path}: cannot parse")


def _finish_chunk(df: pl.DataFrame, src: Source) -> pl.DataFrame:
    values = src.fields
    # Blank lines (a trailing empty line from a spreadsheet): every cell empty -> no row at all.
    blank = pl.all_horizontal([pl.col("_date_raw").is_null(), *[pl.col(c).is_null() for c in values]])
    if src.symbol_column:
        blank = blank & (pl.col("symbol").is_null() | (pl.col("symbol") == ""))
    flags = df.select(blank.any().alias("blank"),
                      pl.any_horizontal([pl.col(c).is_infinite() for c in values] or [pl.lit(False)]).any()
                      .alias("inf")).row(0, named=True)   # one pass; copies only when something is found
    if flags["blank"]:
        df = df.filter(~blank)
    if src.symbol_column:
        empty = df["symbol"].is_null() | (df["symbol"] == "")
        if empty.any():
            i = empty.arg_max()
            raise InputError(f"{src.where(df['_row'][i])}: empty symbol in column {src.symbol_column!r}")
    for c in values if flags["inf"] else ():
        inf = df[c].is_infinite()
        if inf.any():
            i = inf.arg_max()
            raise InputError(f"{src.where(df['_row'][i])}: column {c!r}: infinite value")
    rows = df["_row"]

    def where(i: int) -> str:
        return location(src.path, rows[int(i)])

    raw = integral_float_dates(df["_date_raw"], src.path, src.date_column, where)
    if "_time_raw" in df.columns:
        raw = clock.join_stamp(raw, df["_time_raw"], src.path, src.time_column or "time", where)
        df = df.drop("_time_raw")
    dates = parse_dates(raw, src.path, src.date_column, where)
    return df.with_columns(dates).drop("_date_raw")


def finish_values(lf: pl.LazyFrame, src: Source) -> pl.LazyFrame:
    """Add Yahoo's factor (adj_close / close, in float64) and cast every value to float32 as stored."""
    lf, canon = adjust.with_input_factor(lf, list(src.value_columns.values()))
    # A NaN cell is a missing value, like an empty one ("NaN" text, or pandas' NaN in Parquet).
    return lf.with_columns([pl.col(c).fill_nan(None).cast(pl.Float32) for c in canon])


def sniff_date_format(src: Source) -> str | None:
    """"yyyymmdd-int" when the date column is 8-digit integers, else None (decided on the parsed column)."""
    if is_parquet(src.path) or src.head is None:
        return None
    col = src.head[src.date_column].cast(pl.String).drop_nulls().str.strip_chars()
    if col.len() and col.str.contains(r"^(18|19|20|21|22)\d{6}$").all():
        return "yyyymmdd-int"
    return None


def _explain_bad_value(src: Source) -> pl.DataFrame:
    """Re-read as text; raise InputError at the first non-numeric cell, else return the text frame."""
    try:
        df = _scan(src, text_only=True).collect()
    except pl.exceptions.PolarsError as exc:
        if not is_parquet(src.path):        # most likely a line with more fields: name it
            textscan.exact_lines(np.frombuffer(src.data, np.uint8) if src.data is not None
                                 else textscan.map_file(src.path), src.separator, len(src.columns), src.path)
        raise InputError(f"{src.path}: cannot parse ({_one_line(exc)})") from None
    for s in src.value_columns:
        col = df[s]
        if col.dtype == pl.String:
            parsed = col.str.strip_chars().cast(pl.Float64, strict=False)
            bad = parsed.is_null() & col.is_not_null()
            if bad.any():
                i = bad.arg_max()
                cell = str(col[i]).strip()
                hint = (f" (a missing-value marker? pass --na {cell!r})"
                        if 0 < len(cell) <= 6 and not any(ch.isdigit() for ch in cell) else "")
                raise InputError(f"{src.where(df['_row'][i])}: column {C.short(s)}: non-numeric value "
                                 f"{C.short(col[i])}{hint}")
    return df
