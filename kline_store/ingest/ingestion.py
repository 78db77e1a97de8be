"""Full ingest: input files -> validated bars -> a new generation, block by block -> a new store version.

Everything happens under the writer lock, the "is a store already there" check included, so two ingests
into one place cannot both win. Nothing is published until every input has been read and validated; the
panel is written into a staging file and published by an atomic manifest swap, so a failed or killed ingest
leaves an existing store as it was, and a failed first ingest leaves nothing behind (not even its folder).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

import dataclasses
from dataclasses import dataclass

from . import adjust, barsize, calnote, exchanges, from_frames, grid, panel, qlib_store
from ..store import timeaxis
from .dates import check_timezone, exchange_zone, moved_note
from .. import progress
from ..store import NewVersion, bar_extent, collect, whole_store, manifest as mf, writer
from .bars import Bars, build_calendar, choose_axis, read_bars, where_day
from .options import AxisOptions, ReadOptions
from .panel_layout import PanelLayout
from ..store.blockwriter import BlockWriter
from ..errors import InputError
from .inputs import as_input_list, expand_inputs, fixed_symbol
from .report import IngestReport

BLOCK_BYTES = 16 << 20   # a block of the new panel: small enough that writing one overlaps filling the next


def ingest(inputs: Sequence[str | os.PathLike], out: str | os.PathLike, *, calendar: str | None = None,
           user_map: dict[str, str] | None = None, map: Sequence[str] | None = None, strict: bool = False,
           quiet: bool = True, capacity: int | None = None, wait: float = 0.0,
           replace: bool = False, symbol_pattern: str | None = None, freq: str | None = None,
           sessions: str | None = None, stamp: str | None = None, instruments: str | None = None,
           symbol: str | None = None, na: Sequence[str] = (), skip_bad: bool = False, round_stamps: bool = False,
           exclude: Sequence[str] = (), timezone: str | None = None, assume_weekdays: bool = False,
           date_format: str | None = None, skip_rows: int | None = None, no_header: bool = False,
           columns: Sequence[str] | str | None = None) -> IngestReport:
    """Build a store at ``out`` from K-line files (CSV/Parquet files, folders, globs) or a Qlib provider
    directory (qlib_store.py).

    Args:
        inputs: paths, folders or glob patterns.
        out: store directory; an existing store there is replaced atomically with ``replace``, anything
            else in the way is refused.
        calendar: optional file of trading dates (daily stores); default is the union of all input dates.
        user_map / map: column mapping, as a dict or as ``["SRC=DST", ...]`` (``--map``).
        strict: turn data-quality warnings into errors.
        quiet: no progress bar.
        capacity: days reserved per symbol row for future appends (default: see writer.default_capacity).
        wait: seconds to wait for another writer's lock.
        replace: rebuild an existing store at ``out`` from these inputs alone (atomically; without it an
            existing store is refused, so a day's file cannot wipe out years of history by mistake).
        symbol_pattern: regular expression for the symbol in one-file-per-symbol names (its first group),
            e.g. ``r"yahoofinance-(\\w+)-"``; default: the name without its suffix.
        freq: the bar size ("1d", "1min", "5min", "1h", ...); default: daily unless the stamps carry more than
            one time of day, then the most common gap between a symbol's bars of one day.
        sessions: intraday calendar template ("ashare", "us", "24h" or a CSV of open,close): every session bar
            of every trading date of the input; bars outside the sessions are errors. Default: the union of the
            input's stamps.
        stamp: "end" (default) or "start": how bars are stamped, with ``sessions``.
        instruments: with a Qlib provider directory: the symbols of ``instruments/<name>.txt`` ("all", the
            default, "csi300", ...) or of a file in that format.
        symbol: the symbol of a single input (a file or a DataFrame) that has no symbol column.
        na: cell values that mean "missing" besides ``null``, ``NA``, ``N/A``, ``-``, ``--``, ``NaN`` and empty
            cells (FRED's ``.``, ``#N/A``, ...).
        skip_bad: leave out input files that are not bars (ticks, quotes, no date or close) and list them in the
            report, instead of stopping at the first.
        exclude: glob patterns of files to leave out of folders and globs (``*tick*``).
        round_stamps: stamps with seconds or fractions of a second (``09:31:00.5``) rounded to the nearest
            minute (half up); without it such a stamp is refused naming its line.

    ``inputs`` may also be a pandas or polars DataFrame: long format (symbol, date, fields) or one symbol's bars
    (a date column or index, with ``symbol=``); it gets the checks of a file, its messages name "DataFrame: row N".
        timezone: the exchange's IANA zone ("Asia/Shanghai"): stamps with a UTC offset or ``Z`` and
            zone-aware Parquet columns are converted to its clock, and it is recorded in the manifest. Without
            it, one offset per column keeps its wall clock and mixed offsets are refused.
        assume_weekdays: with ``calendar`` or ``sessions`` an exchange code: dates after the last day whose
            holidays the installed exchange_calendars records are the exchange's weekdays (holidays unknown),
            marked in the manifest (``assumed_weekdays``), instead of an error.
        date_format: how the date column is written, as a strftime format polars (chrono) takes: ``%.f``
            fractions, ``%I``/``%p`` 12-hour clocks, ``%b`` month names ("%d.%m.%Y %H:%M:%S%.f", "%d-%b-%y",
            "%b %d %Y", "%Y-%m-%d %I-%p"); a separate time column is joined to the date with a space first.
            Recorded in the manifest: appends reuse it.
        skip_rows: lines before the header. Default: a first line that names no date and close column (a
            comment, a vendor's URL line) is skipped when a header follows within a few lines, and reported.
        no_header, columns: the files have no header line; ``columns`` names their columns in order
            (``["date", "open", ...]`` or ``"date,open,..."``).

    Returns:
        IngestReport with counts and the problems found.
    """
    read = ReadOptions.of(map=map, user_map=user_map, strict=strict, symbol_pattern=symbol_pattern, symbol=symbol,
                          na=na, skip_bad=skip_bad, exclude=exclude, round_stamps=round_stamps,
                          date_format=date_format, skip_rows=skip_rows, no_header=no_header, columns=columns)
    axis = AxisOptions(calendar=calendar, freq=freq, sessions=sessions, stamp=stamp, timezone=timezone,
                       assume_weekdays=assume_weekdays)
    return ingest_with(inputs, out, read, axis, Writing(quiet=quiet, capacity=capacity, wait=wait, replace=replace,
                                                        instruments=instruments))


@dataclass(frozen=True)
class Writing:
    """How an ingest writes its store (the keywords of ``ingest`` that are neither read nor axis options)."""

    quiet: bool = True
    capacity: int | None = None
    wait: float = 0.0
    replace: bool = False
    instruments: str | None = None


def ingest_with(inputs, out: str | os.PathLike, read: ReadOptions, axis: AxisOptions, writing: Writing
                ) -> IngestReport:
    """``ingest`` with its options as objects: files, folders, globs, a Qlib directory or a DataFrame."""
    t0 = time.perf_counter()
    if not isinstance(out, (str, os.PathLike)):
        raise InputError(f"out={from_frames.describe(out)}: expected a store directory path (ks.ingest(inputs, out))")
    if from_frames.is_frame(inputs):   # read like a file, with every option a file takes
        with from_frames.as_file(inputs, read, axis.timezone) as path:
            return ingest_with([path], out, read, axis, writing)
    inputs = as_input_list(inputs)
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    freq = axis.freq
    qlib = qlib_store.provider_input(inputs, writing.instruments, axis.calendar, dict(read.user_map),
                                     read.symbol_pattern)
    if qlib is not None and (axis.sessions or axis.stamp or
                             (freq and (barsize.parse(freq) or timeaxis.parse_freq(freq)) != timeaxis.DAILY)):
        raise InputError(f"{inputs[0]}: a Qlib provider directory holds day bars; --freq/--sessions/--stamp "
                         f"do not apply to it")
    files = [] if qlib else expand_inputs(list(inputs), read.exclude)   # folders and globs walked once, before the lock
    if read.symbol is not None:
        read = read.replace(symbol_pattern=fixed_symbol(read.symbol, files, read.symbol_pattern))
    axis = axis.replace(timezone=check_timezone(axis.timezone))
    instead = ("`kline-store append` adds new data to it, `ingest --replace` (replace=True) rebuilds it from "
               "these inputs alone")
    with progress.silenced(writing.quiet), whole_store(out, wait=writing.wait, replace=writing.replace,
                                                         instead=instead):
        if qlib is not None:
            built = qlib_store.build_store(qlib, out, writing.capacity)
        else:
            result = _build(files, out, read, axis, writing)
        collect(out, built.manifest if qlib is not None else result.manifest)
    if qlib is not None:
        return built.report(out, time.perf_counter() - t0)
    bars, dates, m = result.bars, result.dates, result.manifest
    return IngestReport(out, result.version, len(bars.sources), result.n_bars, len(result.symbols), len(dates),
                        str(dates[0]), str(dates[-1]), result.fields, bars.problems, bars.skipped_empty,
                        bars.dropped_columns, time.perf_counter() - t0,
                        freq=m.get("bar") or m.get("freq", "1d"),
                        skipped_files=bars.skipped, notes=bars.notes)


def _on_sessions(bars: Bars, cal: np.ndarray, code: str) -> None:
    """--calendar CODE: a bar on a day the exchange did not trade (a holiday) is one line naming it."""
    off = ~np.isin(bars.keys("D"), cal)
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise InputError(f"{bars.where(i)}: {bars.names[int(bars.sym[i])]} bar at "
                         f"{timeaxis.show(int(bars.keys('D')[i]), 'D')} is on no {code} session (a holiday or a "
                         f"weekend); {int(off.sum())} bar(s) in all")


@dataclass
class Built:
    """What ``_build`` wrote: the new version, its bars (views dropped), symbols, fields, dates and manifest."""

    version: int
    n_bars: int
    bars: Bars
    symbols: list[str]
    fields: list[str]
    dates: np.ndarray
    manifest: dict


def _build(files: list[Path], out: Path, read: ReadOptions, options: AxisOptions, writing: Writing) -> Built:
    """The whole ingest under the writer lock (held by the caller)."""
    # Big inputs spill their bars into the staging folder (bounded memory however large the input; see
    # bars.spills); small ones keep them in memory, which is faster.
    spill = writer.staging_dir(out) / "bars.spill"
    with exchange_zone(options.timezone) as moved:   # stamps with UTC offsets: to the exchange's clock (--timezone)
        bars = read_bars(files, read, quiet=writing.quiet, spill=spill)
    freq, calendar, capacity = options.freq, options.calendar, writing.capacity
    long_bar = barsize.parse(freq)   # 1w / 1mo: bars on a daily axis
    given = timeaxis.DAILY if long_bar else (timeaxis.parse_freq(freq) if freq is not None else None)
    bars, settled = grid.settle(bars, given, read.skip_bad)   # one bar size, on its grid
    assume = options.assume_weekdays
    if assume and not (exchanges.is_code(calendar) or exchanges.is_code(options.sessions)):
        raise InputError("--assume-weekdays applies with an exchange calendar (--calendar CODE or --sessions CODE)")
    axis = choose_axis(bars, None if long_bar else freq, options.sessions, options.stamp, options.timezone, assume,
                       settled)
    note_moved = moved_note(moved, options.timezone) if axis.freq == timeaxis.DAILY else None
    if note_moved:   # 2000-01-04 00:00+09:00 with --timezone UTC is a bar of 2000-01-03: said, never silent
        bars.notes.append(note_moved)
    if axis.freq == timeaxis.DAILY:
        bars, bar = barsize.settle(bars, long_bar, read.skip_bad)   # daily, weekly or monthly: per file and symbol
        axis = dataclasses.replace(axis, bar=bar,
                                   exchange=str(calendar).upper() if exchanges.is_code(calendar) else None)
    elif long_bar:
        raise InputError(f"--freq {freq}: these bars are intraday ({axis.freq}); ingest them as they are, then "
                         f"resample to 1d and to {long_bar}")
    cal = build_calendar(bars.distinct_keys(axis.unit), axis, calendar, where_day(bars, axis.unit), assume)
    assumed = exchanges.assumed(axis.exchange, cal, axis.unit) if assume and axis.exchange else None
    if axis.exchange is not None and axis.freq == timeaxis.DAILY:
        _on_sessions(bars, cal, axis.exchange)
    symbols = bars.symbols
    fields = adjust.store_fields(bars.fields)
    source = adjust.factor_source(fields)
    dates = timeaxis.stamps(cal, axis.unit)
    rows = {s: i for i, s in enumerate(symbols)}
    lay = PanelLayout.of(bars, cal, axis.unit, np.asarray([rows[n] for n in bars.names], dtype=np.int32))
    first, last = bar_extent(lay.present)
    note = calnote.foreign_dates(lay.present, first, last, dates, symbols) \
        if axis.freq == timeaxis.DAILY and calendar is None else None
    lay.present = np.zeros((0, 0), dtype=bool)
    last_factor = np.full(len(symbols), np.nan) if source == adjust.EVENTS else None
    divisors = np.full(len(symbols), np.nan) if source == adjust.INPUT else None
    with NewVersion(out, len(symbols), len(cal), len(fields), capacity, crash="ingest") as txn:
        step = panel.block_rows(len(cal), len(fields), BLOCK_BYTES)
        # A thread writes and checksums each block while the next is filled (store/blockwriter.py).
        with BlockWriter(txn.gen, step) as put:
            for lo in range(0, len(symbols), step):
                block = put.block(min(step, len(symbols) - lo))
                lay.fill(block, lo, bars, fields)
                state = adjust.finish_block(block, fields, source)
                for acc, got in ((last_factor, state.last), (divisors, state.rebase)):
                    if acc is not None and got is not None:
                        acc[lo: lo + len(block)] = got
                put.put(lo, block)
        m = txn.commit(symbols=symbols, dates=dates, fields=fields, first_bar=first, last_bar=last,
                       n_bars=len(bars), sources=bars.sources, created_at=None,
                       extra={**axis.manifest(), mf.STORE_ID_KEY: mf.new_store_id(),   # a new store's history
                              "calendar_source": str(calendar) if calendar else
                              (f"sessions {axis.sessions.name}" if axis.sessions else "union of input dates"),
                              "adj_factor_source": source,
                              **({"assumed_weekdays": assumed} if assumed else {}),
                              **({"date_format": read.date_format} if read.date_format else {}),
                              "adj_last_factor": adjust.state_list(last_factor),
                              "adj_rebase": adjust.state_list(divisors)})
    n_bars = len(bars)
    notes = list(bars.notes)
    bars = bars.subset(np.zeros(0, dtype=bool))   # drop the views of the spill file before removing it
    bars.notes = notes + ([note] if note else [])
    return Built(txn.version, n_bars, bars, symbols, fields, dates, m)
