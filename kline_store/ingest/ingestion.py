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

from . import adjust, barsize, calnote, columns as C, dates as D, frames as FR, panel as P, qlib_store as Q
from ..store import timeaxis as TA
from .. import progress
from ..store import manifest as mf, writer as W
from .bars import build_calendar, choose_axis, read_bars
from .layout import Layout
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
           symbol: str | None = None, na: Sequence[str] = (), skip_bad: bool = False,
           exclude: Sequence[str] = (), timezone: str | None = None) -> IngestReport:
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

    ``inputs`` may also be a pandas or polars DataFrame: long format (symbol, date, fields) or one symbol's bars
    (a date column or index, with ``symbol=``); it gets the checks of a file, its messages name "DataFrame: row N".
        timezone: the exchange's IANA zone ("Asia/Shanghai"): stamps with a UTC offset or ``Z`` and
            zone-aware Parquet columns are converted to its clock, and it is recorded in the manifest. Without
            it, one offset per column keeps its wall clock and mixed offsets are refused.

    Returns:
        IngestReport with counts and the problems found.
    """
    t0 = time.perf_counter()
    if not isinstance(out, (str, os.PathLike)):
        raise InputError(f"out={FR.describe(out)}: expected a store directory path (ks.ingest(inputs, out))")
    if FR.is_frame(inputs):
        kw = dict(calendar=calendar, user_map=user_map, map=map, strict=strict, quiet=quiet, capacity=capacity,
                  wait=wait, replace=replace, freq=freq, sessions=sessions, stamp=stamp, symbol=symbol, na=na)
        with FR.as_file(inputs, symbol, {**(user_map or {}), **C.parse_mapping(map)}) as path:
            return ingest([path], out, **kw)
    inputs = as_input_list(inputs)
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    umap = dict(user_map or {})
    umap.update(C.parse_mapping(map))
    qlib = Q.provider_input(inputs, instruments, calendar, umap, symbol_pattern)   # read as a directory
    if qlib is not None and (sessions or stamp or (freq and (barsize.parse(freq) or TA.parse_freq(freq)) != TA.DAILY)):
        raise InputError(f"{inputs[0]}: a Qlib provider directory holds day bars; --freq/--sessions/--stamp "
                         f"do not apply to it")
    files = [] if qlib else expand_inputs(list(inputs), exclude)   # folders and globs walked once, before the lock
    if symbol is not None:
        symbol_pattern = fixed_symbol(symbol, files, symbol_pattern)
    instead = ("`kline-store append` adds new data to it, `ingest --replace` (replace=True) rebuilds it from "
               "these inputs alone")
    with progress.silenced(quiet), W.whole_store(out, wait=wait, replace=replace, instead=instead):
        if qlib is not None:
            built = Q.build_store(qlib, out, capacity)
        else:
            result = _build(files, out, calendar, umap, strict, quiet, capacity, symbol_pattern,
                            (freq, sessions, stamp, D.check_timezone(timezone)),
                            dict(na=tuple(na or ()), skip_bad=skip_bad))
        W.collect(out, built.manifest if qlib is not None else result[-1])
    if qlib is not None:
        return built.report(out, time.perf_counter() - t0)
    version, n_bars, bars, symbols, fields, dates, _ = result
    return IngestReport(out, version, len(bars.files), n_bars, len(symbols), len(dates),
                        str(dates[0]), str(dates[-1]), fields, bars.problems, bars.skipped_empty,
                        bars.dropped_columns, time.perf_counter() - t0,
                        freq=result[-1].get("bar") or result[-1].get("freq", "1d"),
                        skipped_files=bars.skipped, notes=bars.notes)


def _build(files: list[Path], out: Path, calendar: str | None, umap: dict[str, str], strict: bool,
           quiet: bool, capacity: int | None, symbol_pattern: str | None, axis_args: tuple, read: dict | None = None):
    """The whole ingest under the writer lock (held by the caller)."""
    # Big inputs spill their bars into the staging folder (bounded memory however large the input; see
    # bars.spills); small ones keep them in memory, which is faster.
    spill = W.staging_dir(out) / "bars.spill"
    with D.exchange_zone(axis_args[3]):   # stamps with UTC offsets: to the exchange's clock (--timezone)
        bars = read_bars(files, user_map=umap, strict=strict, quiet=quiet, spill=spill,
                         symbol_pattern=symbol_pattern, **(read or {}))
    freq, sessions, stamp, timezone = axis_args
    long_bar = barsize.parse(freq)   # 1w / 1mo: bars on a daily axis
    axis = choose_axis(bars, None if long_bar else freq, sessions, stamp, timezone)
    if axis.freq == TA.DAILY:
        axis = dataclasses.replace(axis, bar=barsize.detect(bars, long_bar))
    elif long_bar:
        raise InputError(f"--freq {freq}: these bars are intraday ({axis.freq}); ingest them as they are, then "
                         f"resample to 1d and to {long_bar}")
    cal = build_calendar(bars.distinct_keys(axis.unit), axis, calendar)
    symbols = bars.symbols
    fields = adjust.store_fields(bars.fields)
    source = adjust.factor_source(fields)
    dates = TA.stamps(cal, axis.unit)
    version, generation, _ = W.next_numbers(out)
    rows = {s: i for i, s in enumerate(symbols)}
    lay = Layout.of(bars, cal, axis.unit, np.asarray([rows[n] for n in bars.names], dtype=np.int32))
    first, last = W.bar_extent(lay.present)
    note = calnote.foreign_dates(lay.present, first, last, dates, symbols) \
        if axis.freq == TA.DAILY and calendar is None else None
    lay.present = np.zeros((0, 0), dtype=bool)
    gen = W.NewGeneration(out, generation + 1, len(symbols), len(cal), len(fields), capacity)
    last_factor = np.full(len(symbols), np.nan) if source == adjust.EVENTS else None
    divisors = np.full(len(symbols), np.nan) if source == adjust.INPUT else None
    try:
        step = P.block_rows(len(cal), len(fields), BLOCK_BYTES)
        # A thread writes and checksums each block while the next is filled (store/blockwriter.py).
        with BlockWriter(gen, step) as put:
            for lo in range(0, len(symbols), step):
                block = put.block(min(step, len(symbols) - lo))
                lay.fill(block, lo, bars, fields)
                state = adjust.finish_block(block, fields, source)
                for acc, got in ((last_factor, state.last), (divisors, state.rebase)):
                    if acc is not None and got is not None:
                        acc[lo: lo + len(block)] = got
                put.put(lo, block)
        W.crashpoint("ingest:filled")
        data = gen.finish()
    except BaseException:
        gen.abort()
        raise
    W.crashpoint("ingest:data-in-place")
    m = W.build_manifest(version=version + 1, data=data, symbols=symbols, dates=dates, fields=fields,
                         capacity=gen.capacity, first_bar=first, last_bar=last, n_bars=len(bars),
                         sources=bars.sources, created_at=None,
                         extra={**axis.manifest(), mf.STORE_ID_KEY: mf.new_store_id(),   # a new store's history
                                "calendar_source": str(calendar) if calendar else
                                (f"sessions {axis.sessions.name}" if axis.sessions else "union of input dates"),
                                "adj_factor_source": source,
                                "adj_last_factor": adjust.state_list(last_factor),
                                "adj_rebase": adjust.state_list(divisors)})
    try:
        W.commit(out, m)
    except BaseException:
        W.discard_uncommitted(out, data["file"])
        raise
    n_bars = len(bars)
    bars = bars.subset(np.zeros(0, dtype=bool))   # drop the views of the spill file before removing it
    bars.notes = [note] if note else []
    return version + 1, n_bars, bars, symbols, fields, dates, m
