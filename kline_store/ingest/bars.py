"""Every input file read, validated and flattened into bars (one entry per symbol and day), plus calendars.

Shared by a full ingest (ingestion.py) and an append (update.py). Nothing is written to a store here: the
bars of a big input spill into column files the caller names (in the store's staging folder).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import polars as pl

from . import adjust, columns, dates, exchanges, bar_gaps
from ..store import sessions as store_sessions, timeaxis
from .dates import parse_days
from ..errors import InputError
from .inputs import expand_inputs, is_parquet, location, shown
from .options import ReadOptions
from .. import memory
from ..progress import Progress
from .readers import CHUNK_BYTES, WHOLE_FILE, Reread, Source, inspect_source, iter_chunks, without
from .sink import Sink
from .sources import expected_rows
from .validate import Problem, flagged_problems, merge_problems, quality_flags

EPOCH = np.datetime64("1970-01-01", "D")
# A file above PIECES_FROM bytes is read in pieces of PIECE_BYTES: polars reads ahead while a piece is checked
# and stored, and the reading bar moves. A CSV up to CHECKS_FIRST bytes is checked whole before its first piece.
PIECES_FROM = 4 << 20
CHECKS_FIRST = 64 << 20
PIECE_BYTES = CHUNK_BYTES


@dataclass
class Bars:
    """Validated bars read from the inputs, as flat arrays (one entry per bar).

    For a big full ingest the arrays are views of spill files in the store's staging folder, so reading a
    large CSV holds one chunk in memory at a time, not the whole input.
    """

    names: list[str]                      # symbol code -> name, in first-seen order
    sym: np.ndarray                       # symbol code of each bar
    minute: np.ndarray                    # local stamp of each bar, minutes since 1970-01-01 (int64)
    file: np.ndarray                      # index into ``files``
    row: np.ndarray                       # 0-based data row in its file
    values: np.ndarray                    # [n, len(fields)] float32, NaN where the input has no value
    fields: list[str]                     # the inputs' fields (Yahoo's derived adj_factor included)
    files: list[Path]
    sources: list[dict]
    problems: list[Problem]
    skipped_empty: int = 0                # rows whose prices are all missing: no bar
    dropped_columns: dict[str, list[str]] = field(default_factory=dict)
    intraday: bool = False                # some file carries more than one time of day
    skipped: list[tuple[str, str]] = field(default_factory=list)   # --skip-bad: (file, why) left out
    notes: list[str] = field(default_factory=list)                  # what the ingest reports besides (calnote)
    stamps: np.ndarray | None = None      # the distinct stamps (minutes, sorted), when the reader kept them

    def __len__(self) -> int:
        return len(self.sym)

    def subset(self, mask: np.ndarray) -> "Bars":
        """The same bars filtered by a boolean mask."""
        return Bars(self.names, self.sym[mask], self.minute[mask], self.file[mask], self.row[mask],
                    self.values[mask], self.fields, self.files, self.sources, self.problems,
                    self.skipped_empty, self.dropped_columns, self.intraday, self.skipped)

    @property
    def span(self) -> tuple[int, int] | None:
        """The first and last stamp (minutes), when the reader kept the distinct stamps."""
        return (int(self.stamps[0]), int(self.stamps[-1])) if self.stamps is not None and len(self.stamps) else None

    def distinct_keys(self, unit: str) -> np.ndarray:
        """The distinct keys of the bars on a time axis of ``unit`` (sorted)."""
        if self.stamps is None:
            return timeaxis.unique_keys(self.keys(unit))
        return timeaxis.unique_keys(self.stamps // timeaxis.MINUTES_PER_DAY) if unit == "D" else self.stamps

    def keys(self, unit: str) -> np.ndarray:
        """Each bar's key on a store's time axis: days ("D") or minutes ("m") since 1970-01-01 (int64)."""
        m = np.asarray(self.minute, dtype=np.int64)
        return m // timeaxis.MINUTES_PER_DAY if unit == "D" else m

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
        return f"{shown(f)} {location(f, self.row[i])}"

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
        stamps = np.asarray(self.minute[hits], dtype=np.int64)
        if len(np.unique(stamps)) > 1:   # same day, other times of day: intraday bars read as daily ones
            when = f"date {timeaxis.show(int(stamps[0]) // timeaxis.MINUTES_PER_DAY, 'D')}"
            hint = "; its bars differ in the time of day: an intraday file? leave --freq out or give its bar size"
        else:
            text = timeaxis.show(int(stamps[0]), "m")
            when = f"date {text[:10]}" if text.endswith(" 00:00") else f"at {text}"
            hint = ""
        raise InputError(f"duplicate bar: symbol {self.names[int(self.sym[first])]} {when} appears {len(hits)} "
                         f"times ({', '.join(self.where(i) for i in hits[:4])}); {n_dup} duplicate(s) in all{hint}")


def input_fields(sources: list[Source]) -> list[str]:
    """The union of the fields the sources' frames carry, in store order."""
    return adjust.store_fields([d for s in sources for d in s.fields]) if sources else []


def read_bars(inputs: Sequence[str | os.PathLike], read: ReadOptions | None = None, *, quiet: bool = True,
              spill: Path | None = None) -> Bars:
    """Read, normalise and validate every input; raise InputError on the first hard error.

    Args:
        read: the read options, whole (options.py): ``user_map``, ``strict``, ``symbol_pattern``, ``na`` (cell
            values that mean "missing" besides the usual ones), ``skip_bad`` (a file that is not bars: ticks,
            quotes, no date or close, unreadable, or whose first piece fails, is left out and listed in
            ``Bars.skipped`` instead of stopping the read), ``exclude`` (glob patterns of files to leave out).
        spill: where to spill the bars when they are big (see :func:`spills`); None keeps them in memory.
    """
    read = read or ReadOptions()
    user_map, strict, skip_bad = dict(read.user_map), read.strict, read.skip_bad
    files = expand_inputs(list(inputs), read.exclude)
    sources, skipped = [], []
    for f in files:   # all headers before any row
        try:
            sources.append(inspect_source(f, user_map, read.symbol_pattern, read.na, read=read))
        except InputError as exc:
            if not skip_bad:
                raise
            skipped.append((shown(f), _reason(exc, f)))
    if not sources:
        raise InputError(f"no input file holds bars; skipped {len(skipped)}: {skipped[0][0]}: {skipped[0][1]}")
    files = [s.path for s in sources]
    unused = set(user_map or {}) - {c for s in sources for c in s.columns}
    if unused:
        raise InputError(f"--map {', '.join(sorted(unused))}: no such column in any input "
                         f"(columns of {files[0].name}: {columns.preview(sources[0].columns)})")
    fields = [f for f in input_fields(sources) if any(f in s.fields for s in sources)]
    expect = sum(expected_rows(s) for s in sources)
    if spill is not None and not spills(files, expect, len(fields)):
        spill = None
    sink = Sink(fields, spill, 0 if spill else expect, read.round_stamps)
    for s in sources:
        s.skip_bad = skip_bad
    problems: list[Problem] = []
    n_empty = 0
    prog = Progress(sum(_size(f) for f in files), "reading", enabled=None if not quiet else False, unit="B",
                    scale=True)
    rows_per_file = []
    failed: set[int] = set()
    try:
        for i in range(len(sources)):
            while True:
                before = (sink.mark(i), n_empty, copy.deepcopy(problems))
                try:
                    rows, n_empty, problems = _read_file(sources[i], i, sink, files, n_empty, problems, prog,
                                                         skip_bad, skipped, failed)
                    break
                except Reread as again:     # its text is GB18030, or its numbers need the text path: again
                    sink.rollback(before[0])
                    n_empty, problems = before[1], before[2]
                    sources[i] = again.source
                    sources[i].empty_times = []
                except InputError as exc:   # --skip-bad: a file that is not bars, whatever shows it, goes whole
                    if not skip_bad:
                        raise
                    sink.rollback(before[0])
                    n_empty, problems = before[1], before[2]
                    if i not in failed:
                        skipped.append((shown(files[i]), _reason(exc, files[i])))
                        failed.add(i)
                    rows = 0
                    break
            rows_per_file.append(rows)
    finally:
        prog.close()
        sink.close()
    if sink.n == 0 and skipped:
        raise InputError(f"no input file holds bars; skipped {len(skipped)}: {skipped[0][0]}: {skipped[0][1]}")
    if sink.n == 0:
        raise InputError(f"{files[0] if len(files) == 1 else 'inputs'}: no bar with a price")
    if strict and problems:
        p = problems[0]
        raise InputError(f"--strict: {p.line()}" + (f"; and {len(problems) - 1} more kind(s)" if len(problems) > 1 else ""))
    col = sink.columns()
    srcs = [{"path": shown(s.path), "bytes": _size(s.path), "encoding": s.encoding, "columns": s.mapping,
             "rows": r} for i, (s, r) in enumerate(zip(sources, rows_per_file)) if i not in failed]
    dropped = {shown(s.path): s.dropped for s in sources if s.dropped}
    bars = Bars(sink.names, col["sym"], col["minute"], col["file"], col["row"], col["values"], fields, files, srcs,
                problems, n_empty, dropped, sink.intraday)
    bars.skipped = skipped
    bars.stamps = sink.distinct()
    bars.notes = [n for i, s in enumerate(sources) if i not in failed for n in s.notes]   # lines skipped, close-only
    gone = [(s, s.empty_times) for i, s in enumerate(sources) if s.empty_times and i not in failed]
    if gone:
        bars.notes.append(f"left out {sum(len(e) for _, e in gone)} row(s) whose time of day is empty (--skip-bad), "
                          f"first {gone[0][0].where(gone[0][1][0])}")
    return bars


def spills(files: list[Path], rows: int, n_fields: int) -> bool:
    """Whether bars go to spill files: inputs over WHOLE_FILE bytes, or bars that would take over a quarter of
    the memory available (a cgroup limit included)."""
    return sum(_size(f) for f in files) > WHOLE_FILE or rows * (20 + 4 * n_fields) > memory.available().nbytes // 4


def _read_file(src: Source, i: int, sink: Sink, files: list[Path], n_empty: int, problems: list[Problem],
               prog: Progress, skip_bad: bool, skipped: list, failed: set[int]) -> tuple[int, int, list[Problem]]:
    """One file's chunks into the sink: (rows read, rows without a price so far, problems so far)."""
    rows = 0
    prices = [c for c in columns.PRICE_FIELDS if c in src.value_columns.values()]
    share = _Share(prog, src.path)
    flags = {"_quality": quality_flags(src.fields, prices)}   # computed by polars as it reads the file
    moved = _moved_expr(src)
    if moved is not None:
        flags["_moved"] = moved
        flags["_wall"] = pl.col("_date_raw").dt.replace_time_zone(None)   # the stamp as written, for the note
    for df in _chunks_or_skip(src, skip_bad, skipped, failed, i, share, flags):
        rows += df.height
        q = df["_quality"].to_numpy()
        seen = int(np.bitwise_or.reduce(q)) if len(q) else 0
        df = without(df, "_quality")
        if moved is not None:
            df = _note_moved(df, src)
        if seen & 1:        # no price at all: no bar
            empty = (q & 1) != 0
            n_empty += int(empty.sum())
            df, q = df.filter(pl.Series(~empty)), q[~empty]
        df = df.with_columns(pl.lit(i, dtype=pl.UInt32).alias("_file"))
        if seen >> 1:
            problems = merge_problems(problems, flagged_problems(df, q, files))
        sink.add(adjust.clean(df), i, src.path)
        prog.step(0, note=f"{src.path.name}: {rows:,} rows")
    share.finish()
    return rows, n_empty, problems


def _moved_expr(src: Source) -> pl.Expr | None:
    """A zone-aware Parquet (or DataFrame) date column converted to the exchange's clock: whether a row's date
    moved (its own wall clock's date against the converted one), computed as polars reads the file."""
    dt = src.schema.get(src.date_column) if src.schema else None
    if dates.ZONE.get() is None or src.date_format is not None or not isinstance(dt, pl.Datetime) or not dt.time_zone:
        return None
    return pl.col("_date_raw").dt.replace_time_zone(None).dt.date() != pl.col("_date_fast").dt.date()


def _note_moved(df: pl.DataFrame, src: Source) -> pl.DataFrame:
    """Record the rows of a chunk whose date the conversion moved (dates.moved_note reports them)."""
    mv = df["_moved"].fill_null(False)
    acc = dates.MOVED.get()
    if acc is not None and mv.any():
        j = int(mv.arg_max())
        zone = src.schema[src.date_column].time_zone   # type: ignore[union-attr]
        acc[(str(src.path), int(df["_row"][0]))] = (int(mv.sum()), f"{df['_wall'][j]} {zone}",
                                                     f"{shown(src.path)} {location(src.path, df['_row'][j])}",
                                                     str(df["date"][j]))
    return without(df, "_moved", "_wall")


def _reason(exc: InputError, path: Path) -> str:
    """An error about ``path`` without the path in front: the reason it was skipped."""
    text = str(exc)
    for p in (str(path), shown(path)):
        if text.startswith(p + ": "):
            return text[len(p) + 2:]
    return text


class _Share:
    """A file's share of the reading phase: the bytes of its pieces as they are parsed."""

    def __init__(self, prog: Progress, path: Path) -> None:
        self.prog, self.path, self.size, self.done = prog, path, _size(path), 0

    def __call__(self, share: float) -> None:
        n = int(self.size * share) - self.done
        if n > 0:
            self.prog.step(n)
            self.done += n

    def finish(self) -> None:
        self(1.0)


def _chunks_or_skip(src: Source, skip_bad: bool, skipped: list, failed: set[int], i: int, share: _Share | None = None,
                    extra: dict | None = None):
    """The file's chunks; with ``skip_bad`` a file that fails before its first chunk is listed and left out."""
    it = iter_chunks(src, PIECE_BYTES, done=share, whole=PIECES_FROM, extra=extra, settle=CHECKS_FIRST)
    try:
        first = next(it)
    except StopIteration:
        return
    except InputError as exc:
        if not skip_bad:
            raise
        skipped.append((shown(src.path), _reason(exc, src.path)))
        failed.add(i)
        return
    yield first
    yield from it


def _size(p: Path) -> int:
    try:
        return os.path.getsize(p)
    except OSError:
        return 0


def read_calendar(path: str | os.PathLike) -> np.ndarray:
    """A trading calendar file: one date per row (first column, or a column named like a date).

    Returns sorted unique days since 1970-01-01 (int32).
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such calendar file")
    if not p.is_file():   # a FIFO would block the read forever; a folder is no calendar
        raise InputError(f"{p}: not a regular file; a calendar is a CSV or Parquet file of dates")
    try:
        if is_parquet(p):
            df = pl.read_parquet(p, glob=False)
        else:
            first = p.read_text(errors="replace").splitlines()[:1]
            header = bool(first) and not any(ch.isdigit() for ch in first[0])
            df = pl.read_csv(p, has_header=header, infer_schema_length=0, glob=False)
    except Exception as exc:  # polars raises many kinds; all mean "unreadable"
        raise InputError(f"{p}: cannot read calendar ({' '.join(str(exc).split())[:200]})") from None
    col = next((c for c in df.columns if columns.ALIASES.get(columns.normalise(c)) == "date"), df.columns[0])
    is_open = next((c for c in df.columns if columns.normalise(c) == "is_open"), None)
    if is_open is not None:   # tushare trade_cal lists closed days too, with is_open = 0
        df = df.filter(pl.col(is_open).cast(pl.Int64, strict=False) == 1)
        if df.height == 0:
            raise InputError(f"{p}: calendar has no day with {is_open} = 1")
    skip = 0 if is_parquet(p) or header else -1     # a header-less CSV: data row 0 is line 1
    return np.unique(parse_days(df[col], p, col, lambda i: location(p, int(i) + skip)).cast(pl.Int32).to_numpy())


def calendar_positions(keys: np.ndarray, calendar: np.ndarray, bars: Bars, unit: str) -> np.ndarray:
    """Index of each bar's key in the calendar; InputError listing bars at times outside it."""
    pos = timeaxis.KeyIndex(calendar).find(keys)
    off = pos < 0
    if off.any():
        n = int(off.sum())
        i = int(np.flatnonzero(off)[0])
        extra = np.unique(keys[off])
        shown = ", ".join(timeaxis.show(int(d), unit) for d in extra[:5])
        what = "date(s)" if unit == "D" else "time(s)"
        raise InputError(f"{n} bar(s) at {len(extra)} {what} not in the calendar ({shown}"
                         f"{', ...' if len(extra) > 5 else ''}); first: {bars.names[int(bars.sym[i])]} "
                         f"{timeaxis.show(int(keys[i]), unit)} in {bars.where(i)}")
    return pos


NAIVE = "exchange-local, naive"   # the manifest's timezone of a store built without --timezone


@dataclass(frozen=True)
class Axis:
    """A store's time axis: its bar size, the unit of its keys, and (intraday) its session template."""

    freq: str
    sessions: store_sessions.Sessions | None = None
    bar: str = "1d"          # a daily axis's bar: "1d", "1w" or "1mo" (barsize.py)
    exchange: str | None = None   # --sessions XSHG: every day's own sessions from exchange_calendars
    timezone: str | None = None      # an IANA zone (stamps with UTC offsets were converted to it), or None

    @property
    def unit(self) -> str:
        return timeaxis.unit(self.freq)

    def manifest(self) -> dict:
        """The manifest's record of the axis."""
        return {"freq": self.freq, "timezone": self.timezone or NAIVE,
                "sessions": self.sessions.as_dict() if self.sessions else None,
                **({"bar": self.bar} if self.freq == timeaxis.DAILY else {}),
                **({"exchange": self.exchange} if self.exchange else {})}

    @classmethod
    def of(cls, manifest: dict) -> Axis:
        sess = manifest.get("sessions")
        tz = manifest.get("timezone")
        return cls(manifest.get("freq", timeaxis.DAILY), store_sessions.Sessions.from_dict(sess) if sess else None,
                   manifest.get("bar", "1d"), manifest.get("exchange"), tz if tz and tz != NAIVE else None)


def choose_axis(bars: Bars, freq: str | None = None, sessions: str | None = None, stamp: str | None = None,
                timezone: str | None = None, assume_weekdays: bool = False, settled: str | None = None) -> Axis:
    """The time axis of a new store: the bar size given, else daily unless the bars carry more than one time of
    day (then the most common gap between a symbol's bars of a day). ``settled``: the size grid.settle found
    and checked (no detection or finer check again)."""
    f = settled or (timeaxis.parse_freq(freq) if freq is not None else None)
    if f is None:
        f = bar_gaps.detect_freq(bars.minute, bars.sym, len(bars.names), bars.span) if bars.intraday else timeaxis.DAILY
    finer = bar_gaps.finer_than(f, bars.minute, bars.sym, len(bars.names), bars.span) if freq and not settled else None
    if finer is not None:
        raise InputError(f"{bars.where(finer)}: --freq {freq}: bar at {timeaxis.show(int(bars.minute[finer]), 'm')} is "
                         f"less than {f} after the symbol's previous bar: the bars are finer (leave --freq out, "
                         f"then resample the store)")
    if sessions is not None and f == timeaxis.DAILY:
        raise InputError("--sessions applies to intraday bars; these bars are daily (pass --freq for their size)")
    if stamp is not None and sessions is None:
        raise InputError("--stamp applies with --sessions")
    if sessions is not None and exchanges.is_code(sessions):
        return Axis(f, exchanges.template(str(sessions), np.asarray(bars.minute, dtype=np.int64), stamp,
                                   where_day(bars, "m"), assume_weekdays),
                    exchange=str(sessions).upper(), timezone=timezone)
    return Axis(f, store_sessions.load(sessions, stamp) if sessions is not None else None, timezone=timezone)


def where_day(bars: Bars, unit: str) -> Callable[[int], str]:
    """``where(day)``: the file and line of a bar on (or nearest to) ``day``, for a one-line message."""
    def where(day: int) -> str:
        keys = bars.keys(unit)
        days = keys if unit == "D" else keys // timeaxis.MINUTES_PER_DAY
        return bars.where(int(np.argmin(np.abs(days - int(day))))) if len(days) else "inputs"
    return where


def build_calendar(keys: np.ndarray, axis: Axis, calendar_file: str | os.PathLike | None = None,
                   where: Callable[[int], str] | None = None, assume_weekdays: bool = False) -> np.ndarray:
    """A new store's calendar (sorted keys): the union of the bars' keys, a calendar file's dates (daily), or
    every session bar of every trading date up to the last bar (intraday with a template).

    ``where(day)`` names the bar of a day in a message about the exchange's calendar; ``assume_weekdays`` takes
    the exchange's weekdays after the last day the installed exchange_calendars covers (see exchanges.py)."""
    if calendar_file is not None:
        if axis.freq != timeaxis.DAILY:
            raise InputError("--calendar lists trading dates of daily stores; for intraday bars use --sessions")
        if exchanges.is_code(calendar_file):   # --calendar XNYS: the exchange's sessions over the input's dates
            return exchanges.trading_days(str(calendar_file), int(keys.min()), int(keys.max()), where, assume_weekdays)
        return read_calendar(calendar_file).astype(np.int64)
    if axis.exchange is not None and axis.sessions is not None:
        return exchanges.intraday_calendar(keys, axis.exchange, axis.freq, axis.sessions.stamp, where,
                                    axis.sessions if assume_weekdays else None)
    if axis.sessions is not None:
        return store_sessions.calendar(keys, axis.sessions, axis.freq)
    return timeaxis.unique_keys(keys)
