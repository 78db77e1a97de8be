"""Full ingest: input files -> validated long bars -> [symbol, date, field] panel -> a new store version.

Nothing is written until every input has been read and validated; the panel is written into a staging file
and published by an atomic manifest swap, so a failed or killed ingest leaves an existing store as it was.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from . import adjust, columns as C, lock, manifest as mf, store as S
from .errors import InputError
from .progress import Progress
from .readers import WHOLE_FILE, expand_inputs, inspect_source, is_parquet, iter_chunks
from .validate import Problem, merge_problems, quality_problems

EPOCH = np.datetime64("1970-01-01", "D")


@dataclass
class Bars:
    """Validated bars read from the inputs, as flat arrays (one entry per bar).

    For a full ingest the arrays are views of a spill file in the store's staging folder, so reading a
    large CSV holds one chunk in memory at a time, not the whole input.
    """

    names: list[str]                      # symbol code -> name, in first-seen order
    sym: np.ndarray                       # symbol code of each bar
    day: np.ndarray                       # days since 1970-01-01
    file: np.ndarray                      # index into ``files``
    row: np.ndarray                       # 0-based data row in its file
    values: np.ndarray                    # [n, len(fields)] float32, NaN where the input has no value
    fields: list[str]
    files: list[Path]
    sources: list[dict]
    problems: list[Problem]
    skipped_empty: int = 0                # rows whose prices are all missing: no bar
    dropped_columns: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sym)

    def subset(self, mask: np.ndarray) -> "Bars":
        """The same bars filtered by a boolean mask."""
        return Bars(self.names, self.sym[mask], self.day[mask], self.file[mask], self.row[mask],
                    self.values[mask], self.fields, self.files, self.sources, self.problems,
                    self.skipped_empty, self.dropped_columns)

    @property
    def symbols(self) -> list[str]:
        """Symbols that have bars, sorted."""
        return sorted(self.names)

    def codes_for(self, rows_of: dict[str, int]) -> np.ndarray:
        """Row of each bar, given a symbol -> row mapping (a store's, or the sorted order of a new one)."""
        lookup = np.asarray([rows_of[n] for n in self.names], dtype=np.int32)
        return lookup[self.sym]

    def where(self, i: int) -> str:
        f = self.files[int(self.file[i])]
        at = f"row {int(self.row[i]) + 1}" if is_parquet(f) else f"line {int(self.row[i]) + 2}"
        return f"{f} {at}"

    def present_mask(self, sym: np.ndarray, pos: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        """[n_sym, n_dates] bool of bars; raises InputError naming a duplicated (symbol, date) bar."""
        present = np.zeros(shape, dtype=bool)
        present[sym, pos] = True
        if int(np.count_nonzero(present)) != len(sym):
            self._raise_duplicate(sym, pos)
        return present

    def _raise_duplicate(self, sym: np.ndarray, pos: np.ndarray) -> None:
        key = sym.astype(np.int64) * (int(pos.max()) + 1) + pos
        order = np.argsort(key, kind="stable")
        same = np.flatnonzero(key[order][1:] == key[order][:-1])
        first = order[same[0]]
        hits = order[key[order] == key[first]]
        n_dup = int(len(same))
        raise InputError(f"duplicate bar: symbol {self.names[int(self.sym[first])]} date "
                         f"{EPOCH + int(self.day[first])} appears {len(hits)} times "
                         f"({', '.join(self.where(i) for i in hits[:4])}); {n_dup} duplicate(s) in all")


COLUMNS = (("sym", np.uint32), ("day", np.int32), ("file", np.uint32), ("row", np.uint32), ("values", np.float32))


class _Sink:
    """Collects normalised chunks as flat columns: in memory, or appended to one spill file per column.

    Column files (not records) so that a pass over one column touches only that column's pages.
    """

    def __init__(self, fields: list[str], spill: Path | None) -> None:
        self.fields = fields
        self.spill = spill
        self.fh = {name: open(f"{spill}.{name}", "wb") for name, _ in COLUMNS} if spill else None
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name, _ in COLUMNS}
        self.names: list[str] = []
        self.code: dict[str, int] = {}
        self.n = 0

    def _intern(self, name: str) -> int:
        code = self.code.get(name)
        if code is None:
            code = self.code[name] = len(self.names)
            self.names.append(name)
        return code

    def symbol_codes(self, col: pl.Series) -> np.ndarray:
        """Code of each row's symbol. Files are mostly grouped by symbol: map runs, not rows."""
        starts = np.flatnonzero((col != col.shift(1)).fill_null(True).to_numpy())
        if len(starts) * 8 < len(col):
            codes = np.asarray([self._intern(n) for n in col.gather(starts).to_list()], dtype=np.uint32)
            return np.repeat(codes, np.diff(np.append(starts, len(col))))
        uniq = col.unique().to_list()
        return col.replace_strict(uniq, [self._intern(u) for u in uniq], return_dtype=pl.UInt32).to_numpy()

    def add(self, df: pl.DataFrame, file_id: int) -> None:
        cols = {
            "sym": self.symbol_codes(df["symbol"]),
            "day": df["date"].cast(pl.Int32).to_numpy(),
            "file": np.full(df.height, file_id, dtype=np.uint32),
            "row": df["_row"].to_numpy(),
            "values": df.select([pl.col(f) if f in df.columns else pl.lit(None, dtype=pl.Float32).alias(f)
                                 for f in self.fields]).to_numpy(),
        }
        for name, dtype in COLUMNS:
            arr = np.ascontiguousarray(cols[name], dtype=dtype)
            if self.fh:
                arr.tofile(self.fh[name])
            else:
                self.parts[name].append(arr)
        self.n += df.height

    def columns(self) -> dict[str, np.ndarray]:
        nf = len(self.fields)
        out = {}
        for name, dtype in COLUMNS:
            shape = (self.n, nf) if name == "values" else (self.n,)
            if self.fh:
                self.fh[name].close()
                out[name] = (np.memmap(f"{self.spill}.{name}", dtype=dtype, mode="r", shape=shape)
                             if self.n else np.empty(shape, dtype))
            else:
                out[name] = (np.concatenate(self.parts[name]) if self.parts[name] else np.empty(shape, dtype))
        return out


def input_fields(sources: list) -> list[str]:
    """The union of the fields the sources provide (Yahoo's adj_close brings adj_factor), in store order."""
    names: list[str] = []
    for s in sources:
        for d in s.value_columns.values():
            if d not in names:
                names.append(d)
        if "adj_close" in names and "close" in names and "adj_factor" not in names:
            names.append("adj_factor")
    return order_fields(names)


def read_bars(inputs: Sequence[str | os.PathLike], *, user_map: dict[str, str] | None = None,
              strict: bool = False, quiet: bool = True, spill: Path | None = None,
              symbol_pattern: str | None = None) -> Bars:
    """Read, normalise and validate every input; raise InputError on the first hard error.

    Args:
        spill: a file to spill the bars to (bounded memory for big inputs); None keeps them in memory.
    """
    files = expand_inputs(list(inputs))
    sources = [inspect_source(f, user_map, symbol_pattern) for f in files]   # all headers before any row
    unused = set(user_map or {}) - {c for s in sources for c in s.columns}
    if unused:
        raise InputError(f"--map {', '.join(sorted(unused))}: no such column in any input "
                         f"(columns of {files[0].name}: {', '.join(sources[0].columns)})")
    fields = input_fields(sources)
    sink = _Sink(fields, spill)
    names = [str(f) for f in files]
    parquet = [is_parquet(f) for f in files]
    problems: list[Problem] = []
    n_empty = 0
    prog = Progress(sum(_size(f) for f in files), "reading", enabled=None if not quiet else False)
    rows_per_file = []
    for i, src in enumerate(sources):
        rows = 0
        prices = [c for c in C.PRICE_FIELDS if c in src.value_columns.values()]
        for df in iter_chunks(src):
            rows += df.height
            empty = df.select(pl.all_horizontal([pl.col(c).is_null() for c in prices]).alias("e"))["e"]
            if empty.any():
                n_empty += int(empty.sum())
                df = df.filter(~empty)
            df = df.with_columns(pl.lit(i, dtype=pl.UInt32).alias("_file"))
            problems = merge_problems(problems, quality_problems(df, names, parquet))
            sink.add(df, i)
            prog.step(0, note=f"{src.path.name}: {rows:,} rows")
        rows_per_file.append(rows)
        prog.step(_size(src.path), note=src.path.name)
    prog.close()
    if sink.n == 0:
        raise InputError(f"{files[0] if len(files) == 1 else 'inputs'}: no bar with a price")
    if strict and problems:
        p = problems[0]
        raise InputError(f"--strict: {p.line()}" + (f"; and {len(problems) - 1} more kind(s)" if len(problems) > 1 else ""))
    col = sink.columns()
    srcs = [{"path": str(s.path), "bytes": _size(s.path), "encoding": s.encoding, "columns": s.mapping,
             "rows": r} for s, r in zip(sources, rows_per_file)]
    dropped = {str(s.path): s.dropped for s in sources if s.dropped}
    return Bars(sink.names, col["sym"], col["day"], col["file"], col["row"], col["values"], fields, files, srcs,
                problems, n_empty, dropped)


def _size(p: Path) -> int:
    try:
        return os.path.getsize(p)
    except OSError:
        return 0


@dataclass
class IngestReport:
    """What an ingest or append did, for the summary the CLI prints."""

    store: Path
    version: int
    n_files: int
    n_bars: int
    n_symbols: int
    n_dates: int
    start: str | None
    end: str | None
    fields: list[str]
    problems: list[Problem]
    skipped_empty: int
    dropped_columns: dict[str, list[str]]
    seconds: float
    extra: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        what = "read" if self.extra else "stored"   # an append reports the input it read, then the store
        out = [f"store {self.store} (version {self.version}): {what} {self.n_bars} bars from {self.n_files} file(s) "
               f"in {self.seconds:.2f}s; {self.n_symbols} symbols, {self.n_dates} dates {self.start}..{self.end}, "
               f"fields {' '.join(self.fields)}"]
        for k, v in self.extra.items():
            out.append(f"{k}: {v}")
        if self.skipped_empty:
            out.append(f"skipped {self.skipped_empty} row(s) whose prices are all missing (no bar)")
        for f, cols in list(self.dropped_columns.items())[:3]:
            out.append(f"ignored column(s) {', '.join(cols)} in {f} (text, or a second column for a field)")
        out.extend(("warning " + p.line()) for p in self.problems)
        if not self.problems:
            out.append("problems: none")
        return out


def order_fields(fields: list[str]) -> list[str]:
    """Canonical fields first in their usual order, extras in input order, adj_factor last."""
    base = [f for f in C.BASE_FIELDS if f in fields]
    extra = [f for f in fields if f not in C.BASE_FIELDS and f != "adj_factor"]
    return base + extra + (["adj_factor"] if "adj_factor" in fields else [])


def read_calendar(path: str | os.PathLike) -> np.ndarray:
    """A trading calendar file: one date per row (first column, or a column named like a date)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such calendar file")
    try:
        if is_parquet(p):
            df = pl.read_parquet(p)
        else:
            first = p.read_text(errors="replace").splitlines()[:1]
            header = bool(first) and not any(ch.isdigit() for ch in first[0])
            df = pl.read_csv(p, has_header=header, infer_schema_length=0)
    except Exception as exc:  # polars raises many kinds; all mean "unreadable"
        raise InputError(f"{p}: cannot read calendar ({' '.join(str(exc).split())[:200]})") from None
    col = next((c for c in df.columns if C.ALIASES.get(C.normalise(c)) == "date"), df.columns[0])
    is_open = next((c for c in df.columns if C.normalise(c) == "is_open"), None)
    if is_open is not None:   # tushare trade_cal lists closed days too, with is_open = 0
        df = df.filter(pl.col(is_open).cast(pl.Int64, strict=False) == 1)
        if df.height == 0:
            raise InputError(f"{p}: calendar has no day with {is_open} = 1")
    from .readers import Source, parse_dates
    src = Source(p, df.columns, {col: "date"}, None, "utf-8")
    days = np.unique(parse_dates(df[col], src).cast(pl.Int32).to_numpy())
    return days


def calendar_positions(days: np.ndarray, calendar: np.ndarray, bars: Bars) -> np.ndarray:
    """Index of each bar's day in the calendar; InputError listing bars on days outside it."""
    pos = np.searchsorted(calendar, days)
    pos_c = np.minimum(pos, len(calendar) - 1)
    off = calendar[pos_c] != days
    if off.any():
        n = int(off.sum())
        i = int(np.flatnonzero(off)[0])
        extra = np.unique(days[off])
        shown = ", ".join(str(EPOCH + int(d)) for d in extra[:5])
        raise InputError(f"{n} bar(s) on {len(extra)} date(s) not in the calendar ({shown}"
                         f"{', ...' if len(extra) > 5 else ''}); first: {bars.names[int(bars.sym[i])]} "
                         f"{EPOCH + int(days[i])} in {bars.where(i)}")
    return pos


def scatter(bars: Bars, sym: np.ndarray, day_pos: np.ndarray, fields: list[str], out: np.ndarray,
            chunk: int = 1 << 20) -> None:
    """Write every bar into ``out[sym, day, field]`` (fields the input lacks become NaN).

    Works through the bars in chunks; when ``out`` is a memory map, its written pages are synced and
    released after each chunk, so resident memory stays bounded by the chunk, not the panel.
    """
    src_idx = [bars.fields.index(f) if f in bars.fields else -1 for f in fields]
    direct = src_idx == list(range(len(bars.fields)))
    for lo in range(0, len(sym), chunk):
        v = np.array(bars.values[lo: lo + chunk])
        if not direct:
            v = np.stack([v[:, j] if j >= 0 else np.full(len(v), np.nan, np.float32) for j in src_idx], axis=1)
        out[sym[lo: lo + chunk], day_pos[lo: lo + chunk], :] = v
        if len(sym) > chunk and out.nbytes > S.RELEASE_ABOVE:
            S.release(out)
            S.release(bars.values)


def fill_missing(panel: np.ndarray, present: np.ndarray, rows: int = 256) -> None:
    """NaN in every cell without a bar (each cell is written once: a bar or NaN), a block of rows at a time."""
    for lo in range(0, panel.shape[0], rows):
        block = panel[lo: lo + rows]
        block[~present[lo: lo + rows]] = np.nan
        if panel.shape[0] > rows and panel.nbytes > S.RELEASE_ABOVE:
            S.release(panel)


def fill_event_factor(panel: np.ndarray, fields: list[str], prev_close: np.ndarray | None = None,
                      start: np.ndarray | None = None) -> np.ndarray | None:
    """Fill ``adj_factor`` from split/dividend events for rows that have no vendor factor, in place.

    Args:
        panel: [rows, days, fields] block to fill.
        prev_close / start: per row, the close and (float64) factor of the last stored bar, for appends.

    Returns:
        float64 [rows] last factor of each filled row (NaN elsewhere): the state the next append continues
        from, or None when there is nothing to fill.
    """
    split, div = adjust.event_columns(fields)
    if "adj_factor" not in fields or (split is None and div is None):
        return None
    fi = {f: i for i, f in enumerate(fields)}
    last = np.full(panel.shape[0], np.nan)
    rows = np.flatnonzero(~np.isfinite(panel[:, :, fi["adj_factor"]]).any(axis=1))
    if rows.size == 0:
        return last
    close = panel[rows, :, fi["close"]]
    ratio = adjust.event_ratios(close, panel[rows, :, fi[split]] if split else None,
                                panel[rows, :, fi[div]] if div else None,
                                prev_close[rows] if prev_close is not None else None)
    f = adjust.cumulative_factor(ratio, np.isfinite(close), start[rows] if start is not None else None)
    panel[rows, :, fi["adj_factor"]] = f
    last[rows] = adjust.last_finite(f)
    return last


def factor_state_list(state: np.ndarray | None) -> list[float | None] | None:
    return None if state is None else [None if not np.isfinite(x) else float(x) for x in state]


def factor_source(fields: list[str]) -> str | None:
    """How adj_factor was obtained: from the input (vendor factor, adj_close/close) or from events."""
    if "adj_factor" not in fields:
        return None
    split, div = adjust.event_columns(fields)
    return "events" if (split or div) else "input"


def ingest(inputs: Sequence[str | os.PathLike], out: str | os.PathLike, *, calendar: str | None = None,
           user_map: dict[str, str] | None = None, map: Sequence[str] | None = None, strict: bool = False,
           quiet: bool = True, capacity: int | None = None, wait: float = 0.0,
           replace: bool = False, symbol_pattern: str | None = None) -> IngestReport:
    """Build a store at ``out`` from K-line files (CSV/Parquet files, folders, globs).

    Args:
        inputs: paths, folders or glob patterns.
        out: store directory; an existing store there is replaced atomically, anything else is refused.
        calendar: optional file of trading dates; default is the union of all input dates.
        user_map / map: column mapping, as a dict or as ``["SRC=DST", ...]`` (``--map``).
        strict: turn data-quality warnings into errors.
        quiet: no progress bar.
        capacity: days reserved per symbol row for future appends (default: see store.default_capacity).
        wait: seconds to wait for another writer's lock.
        replace: rebuild an existing store at ``out`` from these inputs alone (atomically; without it an
            existing store is refused, so a day's file cannot wipe out years of history by mistake).
        symbol_pattern: regular expression for the symbol in one-file-per-symbol names (its first group),
            e.g. ``r"yahoofinance-(\\w+)-"``; default: the name without its suffix.

    Returns:
        IngestReport with counts and the problems found.
    """
    t0 = time.perf_counter()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    has_store = (out / mf.MANIFEST).exists()
    if has_store and not replace:
        raise InputError(f"{out}: a store is already there; `kline-store append` adds new data to it, "
                         f"`ingest --replace` (replace=True) rebuilds it from these inputs alone")
    if out.is_dir() and not has_store and not _only_leftovers(out):
        raise InputError(f"{out}: folder is not empty and holds no store; refusing to overwrite it")
    umap = dict(user_map or {})
    umap.update(C.parse_mapping(map))
    created = not has_store
    with lock.WriterLock(out, wait=wait):   # cleanup below runs only while this process holds the lock
        try:
            version, n_bars, bars, symbols, fields, dates = _build(inputs, out, calendar, umap, strict, quiet,
                                                                   capacity, symbol_pattern)
        except BaseException:
            S.clean_staging(out)
            if created and not (out / mf.MANIFEST).exists():
                # A failed first ingest leaves nothing but the folder (and its lock file, released below).
                for p in out.iterdir():
                    if p.name != lock.LOCK_NAME:
                        shutil.rmtree(p) if p.is_dir() else p.unlink()
            raise
    S.gc(out)
    return IngestReport(out, version, len(bars.files), n_bars, len(symbols), len(dates),
                        str(dates[0]), str(dates[-1]), fields, bars.problems, bars.skipped_empty,
                        bars.dropped_columns, time.perf_counter() - t0)


def _only_leftovers(folder: Path) -> bool:
    """True when a folder holds nothing but what a killed or failed first ingest of ours can leave."""
    for p in folder.iterdir():
        n = p.name
        if n == mf.VERSIONS_DIR and any(p.glob("v*.json")):
            return False   # version copies: a store that lost its manifest.json, recoverable, not leftovers
        if not (n in (lock.LOCK_NAME, S.STAGING, mf.VERSIONS_DIR) or n.startswith(f".{mf.MANIFEST}.tmp-")
                or (n.startswith("data-g") and n.endswith(".f32"))):
            return False
    return True


def _build(inputs, out: Path, calendar, umap, strict, quiet, capacity, symbol_pattern):
    """The whole ingest under the writer lock (held by the caller)."""
    S.clean_staging(out)
    # Big inputs spill their bars into the staging folder (bounded memory however large the input); small
    # ones keep them in memory, which is faster.
    files = expand_inputs(list(inputs))   # walk folders and globs once; read_bars gets the files
    big = sum(_size(f) for f in files) > WHOLE_FILE
    bars = read_bars(files, user_map=umap, strict=strict, quiet=quiet,
                     spill=S.staging_dir(out) / "bars.spill" if big else None, symbol_pattern=symbol_pattern)
    days = np.asarray(bars.day)
    cal = read_calendar(calendar) if calendar else np.unique(days)
    pos = calendar_positions(days, cal, bars).astype(np.int32)
    del days
    symbols = bars.symbols
    fields = list(bars.fields)
    split, div = adjust.event_columns(fields)
    if "adj_factor" not in fields and (split or div):
        fields.append("adj_factor")
    dates = EPOCH + cal.astype("timedelta64[D]")
    version, generation, created = S.current_state(out)
    sym = bars.codes_for({s: i for i, s in enumerate(symbols)})
    present = bars.present_mask(sym, pos, (len(symbols), len(cal)))
    gen = S.start_generation(out, generation + 1, len(symbols), len(cal), len(fields), capacity, fill=False)
    panel = gen.logical()
    scatter(bars, sym, pos, fields, panel)
    fill_missing(panel, present)
    factor_state = fill_event_factor(panel, fields)
    source = factor_source(fields)
    rebase = adjust.rebase(panel[:, :, fields.index("adj_factor")]) if source == "input" else None
    mf.crashpoint("ingest:filled")
    first, last = S.bar_extent(present)
    data = S.finish_generation(out, gen)
    mf.crashpoint("ingest:data-in-place")
    m = S.build_manifest(version=version + 1, data=data, symbols=symbols, dates=dates, fields=fields,
                         capacity=gen.capacity, first_bar=first, last_bar=last, n_bars=len(bars),
                         sources=bars.sources, created_at=None,
                         extra={"calendar_source": str(calendar) if calendar else "union of input dates",
                                "adj_factor_source": source,
                                "adj_last_factor": factor_state_list(factor_state),
                                "adj_rebase": factor_state_list(rebase)})
    mf.commit(out, m)
    n_bars = len(bars)
    bars = bars.subset(np.zeros(0, dtype=bool))   # drop the views of the spill file before removing it
    S.clean_staging(out)
    return version + 1, n_bars, bars, symbols, fields, dates
