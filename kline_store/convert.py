"""Full ingest: input files -> validated long bars -> [symbol, date, field] panel -> a new store version.

Nothing is written until every input has been read and validated; the panel is written into a staging file
and published by an atomic manifest swap, so a failed or killed ingest leaves an existing store as it was.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from . import adjust, columns as C, lock, manifest as mf, store as S
from .errors import InputError
from .progress import Progress
from .readers import expand_inputs, inspect_source, is_parquet, read_source
from .validate import Problem, check_duplicates, quality_problems

EPOCH = np.datetime64("1970-01-01", "D")


@dataclass
class Bars:
    """Validated long-format bars read from the inputs."""

    df: pl.DataFrame                      # symbol, date, <fields> (Float64), _file, _row
    fields: list[str]
    files: list[Path]
    sources: list[dict]
    problems: list[Problem]
    skipped_empty: int = 0                # rows whose prices are all missing: no bar
    dropped_columns: dict[str, list[str]] = field(default_factory=dict)

    def subset(self, mask: np.ndarray) -> "Bars":
        """The same bars filtered by a boolean mask over rows."""
        return Bars(self.df.filter(pl.Series(mask)), self.fields, self.files, self.sources, self.problems,
                    self.skipped_empty, self.dropped_columns)

    @property
    def symbols(self) -> list[str]:
        return self.df["symbol"].unique().sort().to_list()

    def day_numbers(self) -> np.ndarray:
        return self.df["date"].cast(pl.Int32).to_numpy()

    def present_mask(self, sym: np.ndarray, pos: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        """[n_sym, n_dates] bool of bars; raises InputError naming a duplicated (symbol, date) bar."""
        present = np.zeros(shape, dtype=bool)
        present[sym, pos] = True
        if int(np.count_nonzero(present)) != len(sym):
            check_duplicates(self.df, [str(f) for f in self.files], [is_parquet(f) for f in self.files])
        return present


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
        out = [f"store {self.store} (version {self.version}): {self.n_bars} bars, {self.n_symbols} symbols, "
               f"{self.n_dates} dates {self.start}..{self.end}, fields {' '.join(self.fields)}; "
               f"{self.n_files} file(s) in {self.seconds:.2f}s"]
        for k, v in self.extra.items():
            out.append(f"{k}: {v}")
        if self.skipped_empty:
            out.append(f"skipped {self.skipped_empty} row(s) whose prices are all missing (no bar)")
        for f, cols in list(self.dropped_columns.items())[:3]:
            out.append(f"ignored text column(s) {', '.join(cols)} in {f}")
        out.extend(("warning " + p.line()) for p in self.problems)
        if not self.problems:
            out.append("problems: none")
        return out


def read_bars(inputs: Sequence[str | os.PathLike], *, user_map: dict[str, str] | None = None,
              strict: bool = False, quiet: bool = True) -> Bars:
    """Read, normalise and validate every input; raise InputError on the first hard error."""
    files = expand_inputs(list(inputs))
    sources = [inspect_source(f, user_map) for f in files]   # every header checked before any row is read
    prog = Progress(len(sources), "reading", enabled=None if not quiet else False)
    frames = []
    for i, src in enumerate(sources):
        df = read_source(src)
        frames.append(df.with_columns(pl.lit(i, dtype=pl.UInt32).alias("_file")))
        prog.step(note=src.path.name)
    prog.close()
    df = pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]
    prices = [c for c in C.PRICE_FIELDS if c in df.columns]
    empty = pl.all_horizontal([pl.col(c).is_null() for c in prices])
    n_empty = int(df.select(empty.sum()).item())
    if n_empty:
        df = df.filter(~empty)
    if df.height == 0:
        raise InputError(f"{files[0] if len(files) == 1 else 'inputs'}: no bar with a price")
    names = [str(f) for f in files]
    parquet = [is_parquet(f) for f in files]
    problems = quality_problems(df, names, parquet)
    if strict and problems:
        p = problems[0]
        raise InputError(f"--strict: {p.line()}" + (f"; and {len(problems) - 1} more kind(s)" if len(problems) > 1 else ""))
    fields = order_fields([c for c in df.columns if c not in ("symbol", "date", "_file", "_row")])
    srcs = [{"path": str(s.path), "bytes": os.path.getsize(s.path), "encoding": s.encoding,
             "columns": s.mapping, "rows": fr.height} for s, fr in zip(sources, frames)]
    dropped = {str(s.path): s.dropped for s in sources if s.dropped}
    return Bars(df, fields, files, srcs, problems, n_empty, dropped)


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
        r = bars.df.row(i, named=True)
        extra = np.unique(days[off])
        shown = ", ".join(str(EPOCH + int(d)) for d in extra[:5])
        raise InputError(f"{n} bar(s) on {len(extra)} date(s) not in the calendar ({shown}"
                         f"{', ...' if len(extra) > 5 else ''}); first: {r['symbol']} {r['date']} "
                         f"in {bars.files[r['_file']]}")
    return pos


def scatter(bars: Bars, sym: np.ndarray, day_pos: np.ndarray, fields: list[str], out: np.ndarray,
            row_offset: int = 0, day_offset: int = 0) -> None:
    """Write every bar into ``out[sym, day, field]``.

    ``out`` may be a window of a larger panel: bar (s, d) lands at out[s - row_offset, d - day_offset].
    """
    vals = bars.df.select([pl.col(f).cast(pl.Float32) if f in bars.df.columns
                           else pl.lit(None, dtype=pl.Float32).alias(f) for f in fields]).to_numpy()
    out[sym - row_offset, day_pos - day_offset, :] = vals


def symbol_codes(col: pl.Series, symbols: list[str], sym_index: dict[str, int] | None = None) -> np.ndarray:
    """Row of each bar's symbol. ``symbols`` sorted -> vectorised via an Enum; else via ``sym_index``."""
    if sym_index is None:
        return col.cast(pl.Enum(symbols)).to_physical().to_numpy().astype(np.int64)
    uniq = col.unique().to_list()
    mapping = pl.DataFrame({"symbol": uniq, "_code": [sym_index[s] for s in uniq]})
    return col.to_frame().join(mapping, on="symbol", how="left", maintain_order="left")["_code"] \
        .to_numpy().astype(np.int64)


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


def factor_source(input_fields: list[str], fields: list[str]) -> str | None:
    """How adj_factor was obtained: from the input (vendor factor, adj_close/close) or from events."""
    if "adj_factor" not in fields:
        return None
    split, div = adjust.event_columns(fields)
    return "events" if (split or div) else "input"


def ingest(inputs: Sequence[str | os.PathLike], out: str | os.PathLike, *, calendar: str | None = None,
           user_map: dict[str, str] | None = None, map: Sequence[str] | None = None, strict: bool = False,
           quiet: bool = True, capacity: int | None = None, wait: float = 0.0) -> IngestReport:
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

    Returns:
        IngestReport with counts and the problems found.
    """
    t0 = time.perf_counter()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / mf.MANIFEST).exists():
        raise InputError(f"{out}: folder is not empty and holds no store; refusing to overwrite it")
    umap = dict(user_map or {})
    umap.update(C.parse_mapping(map))
    bars = read_bars(inputs, user_map=umap, strict=strict, quiet=quiet)
    days = bars.day_numbers()
    cal = read_calendar(calendar) if calendar else np.unique(days)
    pos = calendar_positions(days, cal, bars)
    symbols = bars.symbols
    fields = list(bars.fields)
    split, div = adjust.event_columns(fields)
    if "adj_factor" not in fields and (split or div):
        fields.append("adj_factor")
    dates = EPOCH + cal.astype("timedelta64[D]")
    with lock.WriterLock(out, wait=wait):
        S.clean_staging(out)
        version, generation, created = S.current_state(out)
        gen = S.start_generation(out, generation + 1, len(symbols), len(cal), len(fields), capacity)
        panel = gen.logical()
        sym = symbol_codes(bars.df["symbol"], symbols)
        present = bars.present_mask(sym, pos, (len(symbols), len(cal)))
        scatter(bars, sym, pos, fields, panel)
        factor_state = fill_event_factor(panel, fields)
        mf.crashpoint("ingest:filled")
        first, last = S.bar_extent(present)
        data = S.finish_generation(out, gen)
        mf.crashpoint("ingest:data-in-place")
        m = S.build_manifest(version=version + 1, data=data, symbols=symbols, dates=dates, fields=fields,
                             capacity=gen.panel.shape[1], first_bar=first, last_bar=last, n_bars=len(days),
                             sources=bars.sources, created_at=None,
                             extra={"calendar_source": str(calendar) if calendar else "union of input dates",
                                    "adj_factor_source": factor_source(bars.fields, fields),
                                    "adj_last_factor": factor_state_list(factor_state)})
        mf.commit(out, m)
        S.clean_staging(out)
    S.gc(out)
    return IngestReport(out, version + 1, len(bars.files), len(days), len(symbols), len(cal),
                        str(dates[0]), str(dates[-1]), fields, bars.problems, bars.skipped_empty,
                        bars.dropped_columns, time.perf_counter() - t0)
