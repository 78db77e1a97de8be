"""What an input file holds before its rows are read: its columns, their meaning, encoding and separator.

:func:`inspect_source` reads a file's header (a Parquet file's schema) and its first rows, and resolves its
columns to canonical fields (columns.py): which is the symbol, the date, a time of day, which extra columns are
text and left out. A CSV's encoding is decided from its first block when that is ASCII (the rest is checked
while the rows are parsed, textscan.scan), from the whole file otherwise.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from . import adjust, clock, packed, preamble, textscan, wide
from .columns import BASE_FIELDS, NULL_VALUES, describe_missing, is_index_name, resolve_columns
from .dates import integral_float_dates, parse_dates
from ..errors import InputError
from .inputs import FixedSymbol, is_parquet, location, shift_lines, symbol_from_name
from .options import ReadOptions

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
    settled: bool = True        # the encoding holds for the whole file (else only its first block was seen)
    typed: bool = True          # numbers parsed by polars' typed reader (False: as text, see readers.py)
    row_bytes: float = 64.0     # bytes per row, about (CSV: from the first rows; Parquet: decoded)
    schema: dict[str, pl.DataType] = field(default_factory=dict)   # a Parquet file's column types
    skip_bad: bool = False      # --skip-bad: a row whose time of day is empty is left out (and counted), not refused
    empty_times: list[int] = field(default_factory=list)   # those rows (0-based data rows)
    date_format: str | None = None   # --date-format: the date column (with its time column) read with it
    notes: list[str] = field(default_factory=list)   # how it was read (lines skipped, close-only bars), said once

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


_sniff_separator = preamble.sniff_separator


def inspect_source(path: Path, user_map: dict[str, str] | None = None, symbol_pattern: str | None = None,
                   na: tuple[str, ...] = (), *, read: ReadOptions | None = None) -> Source:
    """Read the header of ``path`` and resolve its columns; raise InputError if date or close is missing.

    ``read``: the read options whose ``date_format``, ``skip_rows``, ``no_header`` and ``columns`` say how the
    file's text is laid out (preamble.py)."""
    read = read or ReadOptions()
    schema: dict[str, pl.DataType] = {}
    pre = preamble.Preamble()
    try:
        if is_parquet(path):
            with open(path, "rb") as fh:   # a file object: polars would expand * or [ ] in a name
                schema = dict(pl.read_parquet_schema(fh))
            cols = list(schema)
            enc, data, sep, settled = "parquet", None, ",", True
            mapping = resolve_columns(cols, user_map)
        else:
            if os.path.getsize(path) == 0:
                raise InputError(f"{path}: file is empty")
            unpacked = packed.read(path)   # .csv.gz, .csv.zst, a .zip of one CSV: decompressed in memory
            enc, data, settled = (*unpacked, True) if unpacked is not None else textscan.sniff_encoding(path)
            given = read.skip_rows is not None or read.no_header or bool(read.columns)
            sep, cols = (",", []) if given else _first_row(path, data)
            mapping = resolve_columns(cols, user_map)
            if given or not {"date", "close"} <= set(mapping.values()):
                # lines before the header, or no header: only then is the text's beginning looked at again
                enc, data, settled, pre = _preamble(path, enc, data, settled, user_map, read)
                if pre.changes or given:
                    sep, cols = _first_row(path, data)
                    mapping = resolve_columns(cols, user_map)
    except InputError:
        raise
    except Exception as exc:  # unreadable parquet footer, permission denied, ...
        raise InputError(f"{path}: cannot read ({_one_line(exc)})") from None
    src = Source(path, cols, mapping, data, enc, sep, symbol_pattern=symbol_pattern, na=tuple(na), settled=settled,
                 date_format=read.date_format)
    shift_lines(path, pre.shift)
    note = pre.note(path)
    if note:
        src.notes.append(note)
    if schema:
        src.schema = schema
        src.row_bytes = float(sum(4 if dt in (pl.Float32, pl.Int32, pl.UInt32, pl.Date) else 16 if dt == pl.String
                                  else 8 for dt in schema.values()) or 8)
    unnamed = [c for c in cols if is_index_name(c) and c not in (user_map or {})]
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
    if enc.startswith("json; "):
        src.notes.append(f"{path}: {enc[6:]}")
    if "date" not in canon:
        wide.refuse_wide(cols, path)
        raise InputError(describe_missing("date", cols, str(path)))
    if "close" not in canon:
        wide.refuse_wide(cols, path)
        price = wide.price_column(cols)
        if price is not None and src.head is None:
            src.head = _head(src)
        if price is None or not wide.dates_only(src.head, src.date_column):
            raise InputError(describe_missing("close", cols, str(path)))
        mapping[price] = "close"
        canon = set(mapping.values())
        src.notes.append(f"{path}: column {price!r} read as close: close-only bars (one price per date, no open, "
                         f"high or low)")
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
    shadowed = [c for c in cols if c not in mapping and not is_index_name(c) and c not in dropped]
    src.dropped = dropped + shadowed
    return src


def _first_row(path: Path, data: bytes | None) -> tuple[str, list[str]]:
    """The separator and the column names of the text's first line."""
    text = _first_line(path, data).decode("utf-8", "replace")
    first = text.lstrip("\ufeff").splitlines()[0] if text.strip() else ""
    if not first.strip():
        raise InputError(f"{path}: file is empty")
    sep = _sniff_separator(first)
    return sep, _header(first, sep)


def _preamble(path: Path, enc: str, data: bytes | None, settled: bool, user_map: dict[str, str] | None,
              read: ReadOptions) -> tuple[str, bytes | None, bool, preamble.Preamble]:
    """Lines before the header skipped, a headerless file's header put in front: the text polars reads."""
    if data is not None:
        head = data[: preamble.SNIFF_BYTES]
    else:
        with open(path, "rb") as fh:
            head = fh.read(preamble.SNIFF_BYTES)
    lines = preamble.first_lines(head)
    pre = preamble.find(path, lines, user_map, read.skip_rows, read.no_header, read.columns)
    if not pre.changes:
        return enc, data, settled, pre
    if data is None and not settled:   # the whole text is held: its encoding is decided on all of it now
        enc, data = textscan.detect_encoding(path)
        settled = True
    if data is None:
        data = path.read_bytes()
    rest = lines[pre.skip:]
    sep = preamble.sniff_separator(rest[0] if rest else "")
    return enc, preamble.rewrite(data, pre, sep), settled, pre


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
        if d in ("symbol", "date", "time") or d in BASE_FIELDS or s in forced:
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
        src.row_bytes = len(first) / max(first.count(b"\n"), 1)
        return _scan(src, text_only=True, data=first).head(1000).collect()
    except pl.exceptions.PolarsError:
        return None  # the full read will report what is wrong, with a line number


_header = preamble.header_names


def _text_extras(src: Source, forced: set[str]) -> list[str]:
    """Extra columns whose first rows hold no number at all: text such as names; they are not fields.

    Canonical fields and columns named in --map are never dropped: a bad value there is an error.
    """
    extras = [s for s, d in src.mapping.items()
              if d not in ("symbol", "date", "time") and d not in BASE_FIELDS and s not in forced]
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


def _scan(src: Source, text_only: bool, date_fmt: str | None = None, data: bytes | None = None) -> pl.LazyFrame:
    """Lazy frame of the source's columns and ``_row`` (0-based data row); numeric columns as Float64 unless
    ``text_only``. ``data``: CSV bytes to parse instead of the file (its first rows)."""
    if is_parquet(src.path):
        lf = pl.scan_parquet(src.path, glob=False)   # a name may hold * or [ ]
    else:
        overrides: dict[str, pl.DataType] = {c: pl.String for c in src.columns}
        if not text_only:
            for s in src.value_columns:
                overrides[s] = pl.Float64
            if date_fmt == YYYYMMDD:
                overrides[src.date_column] = pl.Int64
        data = data if data is not None else src.data
        # The typed fast path leaves out the null literals (a 25% slower parse): a file that has them
        # ("null", "--", "NA") fails it and is read on the text path, which knows them.
        lf = pl.scan_csv(data if data is not None else src.path, separator=src.separator,
                         schema_overrides=overrides, infer_schema_length=0,
                         null_values=NULL_VALUES + list(src.na) if text_only else (list(src.na) or None),
                         glob=False)
    return lf.with_row_index("_row")


YYYYMMDD = "yyyymmdd-int"
# Date cells of these exact shapes (on the first rows) are parsed by polars as it reads the file, with the
# format dates.parse_dates would pick; a chunk where any cell does not parse that way goes to parse_dates.
FAST_FORMATS = ((r"^\d{4}-\d{2}-\d{2}$", "%Y-%m-%d"), (r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$", "%Y-%m-%d %H:%M:%S"),
                (r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}$", "%Y-%m-%d %H:%M"))


def sniff_date_format(src: Source) -> str | None:
    """How the date column is read fast: YYYYMMDD when it is 8-digit integers, a strptime format from
    FAST_FORMATS when every first cell has its shape, else None (dates.parse_dates on the text)."""
    if is_parquet(src.path) or src.head is None or src.date_format is not None:
        return None
    col = src.head[src.date_column].cast(pl.String).drop_nulls()
    if not col.len():
        return None
    if col.str.strip_chars().str.contains(r"^(18|19|20|21|22)\d{6}$").all():
        return YYYYMMDD
    if src.time_column is not None:   # a stamp joined from two columns: clock.py
        return None
    return next((fmt for shape, fmt in FAST_FORMATS if col.str.contains(shape).all()), None)


def expected_rows(src: Source) -> int:
    """About how many rows the file holds: a Parquet file's count, a CSV's bytes over its bytes per row."""
    if is_parquet(src.path):
        try:
            return int(pl.scan_parquet(src.path, glob=False).select(pl.len()).collect().item())
        except pl.exceptions.PolarsError:
            return 0
    size = len(src.data) if src.data is not None else os.path.getsize(src.path)
    return int(size / max(src.row_bytes, 1.0) * 1.05) + 16
