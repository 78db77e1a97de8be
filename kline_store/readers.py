"""Read one input file (CSV in UTF-8 or GBK/GB18030, or Parquet) into a normalised polars frame.

Output columns: ``symbol`` (str), ``date`` (pl.Date), ``_row`` (0-based data row, for messages), and one
Float64 column per canonical field. Numeric cells are parsed by polars' CSV reader (fast path); only when that
fails do we re-read as text to name the exact line, column and value.
"""

from __future__ import annotations

import glob as _glob
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl

from . import columns as C
from .errors import InputError

CSV_SUFFIXES = (".csv", ".txt", ".tsv")
PARQUET_SUFFIXES = (".parquet", ".pq")


def expand_inputs(inputs: list[str | os.PathLike]) -> list[Path]:
    """Files, folders (their CSV/Parquet files, recursively) and glob patterns -> sorted unique files."""
    if not inputs:
        raise InputError("no input given")
    files: list[Path] = []
    for item in inputs:
        s = str(item)
        p = Path(s)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _is_data_file(f))
            if not found:
                raise InputError(f"{p}: folder holds no .csv or .parquet file")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        elif any(ch in s for ch in "*?["):
            found = []
            for m in sorted(_glob.glob(s, recursive=True)):
                mp = Path(m)
                if mp.is_dir():
                    found.extend(sorted(f for f in mp.rglob("*") if f.is_file() and _is_data_file(f)))
                elif mp.is_file():
                    found.append(mp)
            if not found:
                raise InputError(f"{s}: pattern matches no file")
            files.extend(found)
        else:
            raise InputError(f"{s}: no such file or folder")
    seen: set[Path] = set()
    out = []
    for f in files:
        r = f.resolve()
        if r not in seen:
            seen.add(r)
            out.append(f)
    return out


def _is_data_file(p: Path) -> bool:
    name = p.name.lower()
    return not name.startswith(".") and name.endswith(CSV_SUFFIXES + PARQUET_SUFFIXES)


def symbol_from_name(p: Path, pattern: str | None = None) -> str:
    """The symbol of a one-file-per-symbol input: its name without the data suffix (`000001.SZ.csv`), or
    what ``pattern`` (a regular expression; its first group if it has one) finds in that name."""
    name = p.name
    for suffix in CSV_SUFFIXES + PARQUET_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    if pattern:
        m = re.search(pattern, name)
        if m is None:
            raise InputError(f"{p}: --symbol-pattern {pattern!r} does not match the file name {name!r}")
        return m.group(1) if m.groups() else m.group(0)
    return name


def is_parquet(p: Path) -> bool:
    return p.name.lower().endswith(PARQUET_SUFFIXES)


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

    @property
    def symbol_column(self) -> str | None:
        return next((s for s, d in self.mapping.items() if d == "symbol"), None)

    @property
    def date_column(self) -> str:
        return next(s for s, d in self.mapping.items() if d == "date")

    @property
    def value_columns(self) -> dict[str, str]:
        return {s: d for s, d in self.mapping.items() if d not in ("symbol", "date")}


def _detect_encoding(path: Path) -> tuple[str, bytes | None]:
    """UTF-8 if the file decodes as such, else GB18030 (a superset of GBK); returns re-encoded bytes then."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    if head.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig", None
    try:
        # Cut at the last newline so a multi-byte character split by the read does not count as invalid.
        head.rsplit(b"\n", 1)[0].decode("utf-8") if len(head) == 1 << 16 else head.decode("utf-8")
        return "utf-8", None
    except UnicodeDecodeError:
        pass
    raw = path.read_bytes()
    try:
        return "gb18030", raw.decode("gb18030").encode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: neither UTF-8 nor GBK/GB18030 text (byte {exc.start})") from None


def _sniff_separator(first_line: str) -> str:
    counts = {sep: first_line.count(sep) for sep in (",", "\t", ";", "|")}
    return max(counts, key=counts.get) if max(counts.values()) else ","


def inspect_source(path: Path, user_map: dict[str, str] | None = None, symbol_pattern: str | None = None
                   ) -> Source:
    """Read the header of ``path`` and resolve its columns; raise InputError if date or close is missing."""
    try:
        if is_parquet(path):
            cols = list(pl.read_parquet_schema(path).keys())
            enc, data, sep = "parquet", None, ","
        else:
            if os.path.getsize(path) == 0:
                raise InputError(f"{path}: file is empty")
            enc, data = _detect_encoding(path)
            text = data[:4096].decode("utf-8", "replace") if data is not None else \
                open(path, "rb").read(4096).decode("utf-8", "replace")
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
    canon = set(mapping.values())
    src = Source(path, cols, mapping, data, enc, sep, symbol_pattern=symbol_pattern)
    if not src.symbol_column:
        symbol_from_name(path, symbol_pattern)   # a pattern that does not match: say so before reading
    if "date" not in canon:
        raise InputError(C.describe_missing("date", cols, str(path)))
    if "close" not in canon:
        raise InputError(C.describe_missing("close", cols, str(path)))
    src.head = _head(src)
    dropped = _text_extras(src, set(user_map or {}))
    for col in dropped:
        del mapping[col]
    # A second column for the same field ("Date" beside "date", "code" beside "ts_code") is left out: say so.
    for c in [c for c in cols if re.search(r"_duplicated_\d+$", c) and c in mapping]:
        del mapping[c]   # polars' name for a repeated header ("close,close"): the first one is the field
    shadowed = [c for c in cols if c not in mapping and C.normalise(c)
                and not C.normalise(c).startswith("unnamed") and C.normalise(c) != "index" and c not in dropped]
    src.dropped = dropped + shadowed
    return src


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
              if d not in ("symbol", "date") and d not in C.BASE_FIELDS and s not in forced]
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
    return " ".join(str(exc).split())[:300]


def _scan(src: Source, text_only: bool, date_fmt: str | None = None, data: bytes | None = None,
          row_offset: int = 0) -> pl.LazyFrame:
    """Lazy frame of the source's columns; numeric columns as Float64 unless ``text_only``.

    ``data``: CSV bytes to parse instead of the file (a piece of it); ``row_offset``: its first data row.
    """
    if is_parquet(src.path):
        lf = pl.scan_parquet(src.path)
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
                         null_values=C.NULL_VALUES if text_only else None)
    return lf.with_row_index("_row", offset=row_offset)


def _float_exprs(src: Source, text_only: bool) -> list[pl.Expr]:
    out = []
    for s, d in src.value_columns.items():
        e = pl.col(s)
        if text_only:
            e = e.str.strip_chars()
        out.append(e.cast(pl.Float64, strict=False).alias(d) if text_only else e.cast(pl.Float64).alias(d))
    return out


CHUNK_BYTES = 64 << 20   # CSV bytes parsed at a time for big files: bounds memory whatever the file size
WHOLE_FILE = 256 << 20   # files up to this size are parsed in one go (fastest: polars' parallel reader)


def read_source(src: Source) -> pl.DataFrame:
    """All rows of one file as one normalised frame (see :func:`iter_chunks`)."""
    chunks = list(iter_chunks(src))
    return chunks[0] if len(chunks) == 1 else pl.concat(chunks)


def iter_chunks(src: Source, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pl.DataFrame]:
    """The rows of one file, normalised, in chunks of bounded size (one chunk for small files).

    Columns: ``_row`` (0-based data row), ``symbol``, ``date`` (pl.Date), canonical fields as Float32.
    Fast path: a typed polars parse of each chunk of whole lines (big CSVs are cut at line ends, each piece
    parsed with the header in front). Only if it fails is the file re-read as text to find the offending
    cell, so errors name file, line, column and value.
    """
    symbol = symbol_from_name(src.path, src.symbol_pattern)
    sym_expr = (pl.col(src.symbol_column).cast(pl.String).str.strip_chars()
                if src.symbol_column else pl.lit(symbol, dtype=pl.String)).alias("symbol")
    fmt = sniff_date_format(src)
    canon = list(src.value_columns.values())
    keep = [pl.col("_row"), sym_expr, pl.col(src.date_column).alias("_date_raw")]
    n = 0
    try:
        for piece in _pieces(src, chunk_bytes):
            df = finish_values(_scan(src, text_only=False, date_fmt=fmt, data=piece, row_offset=n)
                               .select(*keep, *_float_exprs(src, text_only=False)), canon).collect()
            del piece
            if df.height:
                n += df.height
                yield _finish_chunk(df, src)
    except pl.exceptions.PolarsError:
        if n:
            raise _explain_or_generic(src) from None
        text = _explain_bad_value(src)  # raises with the exact line; returns only if polars' error was elsewhere
        df = finish_values(text.lazy().select(*keep, *_float_exprs(src, text_only=True)), canon).collect()
        n = df.height
        if n:
            yield _finish_chunk(df, src)
    except OSError as exc:
        raise InputError(f"{src.path}: cannot read ({_one_line(exc)})") from None
    if n == 0:
        raise InputError(f"{src.path}: no data rows")


def _pieces(src: Source, chunk_bytes: int) -> Iterator[bytes | None]:
    """CSV bytes with the header line in front, cut at line ends, about ``chunk_bytes`` each.

    Yields None once for Parquet and files up to WHOLE_FILE: polars reads those whole.
    """
    size = len(src.data) if src.data is not None else os.path.getsize(src.path)
    if is_parquet(src.path) or size <= max(chunk_bytes, WHOLE_FILE):
        yield src.data
        return
    with (io.BytesIO(src.data) if src.data is not None else open(src.path, "rb")) as fh:
        header = fh.readline()
        carry = b""
        while True:
            block = fh.read(chunk_bytes)
            data = memoryview(carry + block if carry else block)
            if not block:
                if len(data):
                    yield b"".join((header, data))
                return
            cut = bytes(data[-65536:]).rfind(b"\n")
            if cut < 0:                       # a line longer than 64 KiB: read on
                carry = bytes(data)
                continue
            cut += len(data) - min(len(data), 65536) + 1
            carry = bytes(data[cut:])
            yield b"".join((header, data[:cut]))   # the one copy of each piece


def _explain_or_generic(src: Source) -> InputError:
    try:
        _explain_bad_value(src)
    except InputError as exc:
        return exc
    return InputError(f"{src.path}: cannot parse")


def _finish_chunk(df: pl.DataFrame, src: Source) -> pl.DataFrame:
    values = list(src.value_columns.values())
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
            raise InputError(f"{src.path}: {_line(src, df['_row'][i])}: empty symbol in column "
                             f"{src.symbol_column!r}")
    for c in values if flags["inf"] else ():
        inf = df[c].is_infinite()
        if inf.any():
            i = inf.arg_max()
            raise InputError(f"{src.path}: {_line(src, df['_row'][i])}: column {c!r}: infinite value")
    return df.with_columns(parse_dates(df["_date_raw"], src, df["_row"])).drop("_date_raw")


def finish_values(lf: pl.LazyFrame, canon: list[str]) -> pl.LazyFrame:
    """Add Yahoo's factor (adj_close / close, in float64) and cast every value to float32 as stored."""
    if "adj_close" in canon and "close" in canon and "adj_factor" not in canon:
        lf = lf.with_columns(pl.when(pl.col("close") > 0).then(pl.col("adj_close") / pl.col("close"))
                             .alias("adj_factor"))
        canon = canon + ["adj_factor"]
    # A NaN cell is a missing value, like an empty one ("NaN" text, or pandas' NaN in Parquet).
    return lf.with_columns([pl.col(c).fill_nan(None).cast(pl.Float32) for c in canon])


def sniff_date_format(src: Source) -> str | None:
    """"yyyymmdd-int" when the date column is 8-digit integers, else None (decided on the parsed column)."""
    if is_parquet(src.path) or src.head is None:
        return None
    col = src.head[src.date_column].cast(pl.String).drop_nulls().str.strip_chars()
    if col.len() and col.str.contains(r"^(19|20)\d{6}$").all():
        return "yyyymmdd-int"
    return None


def _line(src: Source, row: int) -> str:
    """Where a data row is, in the file's own terms: "line N" of a CSV (header is line 1), "row N" of Parquet."""
    return f"line {int(row) + 2}" if not is_parquet(src.path) else f"row {int(row) + 1}"


def _explain_bad_value(src: Source) -> pl.DataFrame:
    """Re-read as text; raise InputError at the first non-numeric cell, else return the text frame."""
    try:
        df = _scan(src, text_only=True).collect()
    except pl.exceptions.PolarsError as exc:
        raise _ragged_line(src) or InputError(f"{src.path}: cannot parse ({_one_line(exc)})") from None
    for s, d in src.value_columns.items():
        col = df[s]
        if col.dtype == pl.String:
            parsed = col.str.strip_chars().cast(pl.Float64, strict=False)
            bad = parsed.is_null() & col.is_not_null()
            if bad.any():
                i = bad.arg_max()
                raise InputError(f"{src.path}: {_line(src, df['_row'][i])}: column {s!r}: "
                                 f"non-numeric value {col[i]!r}")
    return df


def _ragged_line(src: Source) -> InputError | None:
    """The first line whose number of fields differs from the header's (error path only: reads the file)."""
    if is_parquet(src.path):
        return None
    import csv
    text = src.data.decode("utf-8") if src.data is not None else \
        src.path.read_text(encoding="utf-8-sig", errors="replace")
    rows = csv.reader(io.StringIO(text), delimiter=src.separator)
    width = len(next(rows, []))
    for n, row in enumerate(rows, start=2):
        if row and len(row) != width:
            return InputError(f"{src.path}: line {n}: {len(row)} fields, the header has {width} "
                              f"(an unquoted thousands separator, or a cut line?)")
    return None


def parse_dates(raw: pl.Series, src: Source, rows: pl.Series | None = None) -> pl.Series:
    """Dates in any accepted form -> pl.Date: YYYYMMDD integers, ISO, with a time of day, M/D/YYYY, ...

    Long files repeat each date once per symbol, so only the distinct values are parsed. ``rows`` gives
    each value's data row (for messages) when ``raw`` is a chunk of a file.
    """
    def line(i: int) -> str:
        return _line(src, rows[i] if rows is not None else i)

    if raw.dtype.is_integer() and not raw.null_count():
        return _yyyymmdd(raw, src, line)
    uniq = raw.drop_nulls().unique(maintain_order=True)   # first-seen order: messages name the earliest line
    parsed = _parse_unique_dates(uniq, raw, src, line)
    out = raw.replace_strict(uniq, parsed, default=None, return_dtype=pl.Date)
    if out.null_count():
        raise InputError(f"{src.path}: {line(out.is_null().arg_max())}: missing date in column "
                         f"{src.date_column!r}")
    return out.alias("date")


def _yyyymmdd(raw: pl.Series, src: Source, line) -> pl.Series:
    """YYYYMMDD integers -> dates (tushare's trade_date); rejects 20240230 and the like.

    Converts the distinct values only, then gathers through a lookup table indexed by value.
    """
    v = raw.to_numpy().astype(np.int64)
    lo, hi = int(v.min()), int(v.max())
    uniq = raw.unique().to_numpy().astype(np.int64)
    y, m, d = uniq // 10000, uniq // 100 % 100, uniq % 100
    months = (y - 1970) * 12 + (m - 1)
    days = months.astype("datetime64[M]").astype("datetime64[D]") + (d - 1)
    back = days.astype("datetime64[M]").astype(np.int64)
    bad = (m < 1) | (m > 12) | (d < 1) | (back != months) | (y < 1800) | (y > 2200)
    if bad.any():
        value = int(uniq[np.flatnonzero(bad)[0]])
        i = int(np.flatnonzero(v == value)[0])
        raise InputError(f"{src.path}: {line(i)}: unparseable date {value} in column "
                         f"{src.date_column!r} (expected YYYYMMDD)")
    if hi - lo > 50_000_000:   # cannot happen once validated (1800..2200), but keep the table bounded
        return raw.replace_strict(pl.Series(uniq), pl.Series(days), return_dtype=pl.Date).alias("date")
    table = np.zeros(hi - lo + 1, dtype="datetime64[D]")
    table[uniq - lo] = days
    return pl.Series("date", table[v - lo])


def _parse_unique_dates(uniq: pl.Series, raw: pl.Series, src: Source, line) -> pl.Series:
    name = src.date_column
    dt = uniq.dtype

    def fail(value: object, expected: str) -> InputError:
        i = (raw == value).arg_max()
        return InputError(f"{src.path}: {line(i)}: unparseable date {value!r} in column {name!r} "
                          f"({expected})")

    if dt == pl.Date:
        return uniq
    if isinstance(dt, pl.Datetime) and dt.time_zone:
        return uniq.dt.replace_time_zone(None).dt.date()   # the local trading date, not the UTC one
    if dt.is_temporal():
        return uniq.cast(pl.Datetime).dt.date()
    if dt.is_integer() or dt.is_float():
        text = uniq.cast(pl.Int64, strict=False).cast(pl.String)
        out = text.str.to_date("%Y%m%d", strict=False)
        if out.null_count():
            raise fail(uniq.filter(out.is_null())[0], "expected YYYYMMDD")
        return out
    text = uniq.cast(pl.String).str.strip_chars()
    if text.str.contains(r"[\sT]\d").any():
        # Keep the date part: drop a time of day ("2006-11-07 15:00:00", "2020-01-02T00:00:00Z").
        text = text.str.extract(r"^([^\sT]+)", 1)
    if text.len() == 0:
        raise InputError(f"{src.path}: date column {name!r} is empty")
    sample = text.head(1000)
    fmt = next((f for f in C.DATE_FORMATS if sample.str.to_date(f, strict=False).null_count() == 0), None)
    if fmt is None:
        # No single format fits: name a value no format reads, or two values in different formats.
        fits = {f: sample.str.to_date(f, strict=False).is_not_null() for f in C.DATE_FORMATS}
        for i, v in enumerate(sample):
            if not any(fits[f][i] for f in fits):
                raise fail(uniq[i], "accepted: YYYYMMDD, YYYY-MM-DD[ HH:MM:SS], M/D/YYYY, YYYY/MM/DD")
        first = next(f for f in C.DATE_FORMATS if fits[f][0])
        j = int((~fits[first]).arg_max())
        a, b = uniq[0], uniq[j]
        raise InputError(f"{src.path}: mixed date formats in column {name!r}: {a!r} ({line((raw == a).arg_max())})"
                         f" and {b!r} ({line((raw == b).arg_max())}); use one format per file")
    out = text.str.to_date(fmt, strict=False)
    if out.null_count():
        raise fail(uniq.filter(out.is_null())[0], f"expected format {fmt}")
    return out
