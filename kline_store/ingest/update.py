"""Daily operation: add new days and new symbols to a store, and apply revised bars.

Two ways to write, chosen per append:

* **tail** (the daily case, cost proportional to the new data): new days land in the reserved room after each
  symbol row, new symbols become new rows at the end of the file, and row checksums are extended
  incrementally. The bytes are reserved first and written with pwrite (never through a mapping), so a full
  disk is an error before anything is written. No byte that any committed version can see is modified, so
  open readers keep their snapshot and a killed append leaves the previous version intact.
* **rewrite** (history changes): revised cells, dates inserted inside or before the calendar, new fields or
  exhausted capacity write a new generation file (copy-on-write), a block of rows at a time, then swap the
  manifest.

Alignment is always by calendar date, never by a symbol's own row order: a symbol suspended on a new day gets
NaN on exactly that day. Symbols keep their row for life (new listings are added at the end), so symbol
indices stay valid across versions.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from . import adjust, barsize, dates, exchanges, from_frames, grid, panel
from ..store import NewVersion, TailAppend, bar_extent, clean_staging, collect, lock, manifest as mf, prepare, universes
from ..store import sessions, timeaxis
from .bars import Axis, Bars, read_bars, read_calendar, where_day
from ..errors import InputError
from .inputs import as_input_list, expand_inputs, fixed_symbol
from .options import AxisOptions, ReadOptions
from .report import IngestReport
from ..store.snapshot import Store, open_store


@dataclass
class AppendPlan:
    """What an append will do, computed before anything is written."""

    calendar: np.ndarray          # new calendar: keys in the store's unit (days or minutes since 1970)
    unit: str                     # "D" or "m"
    symbols: list[str]            # old symbols, then new ones in sorted order
    fields: list[str]             # old fields, then new ones
    sym: np.ndarray               # row of each input bar
    pos: np.ndarray               # calendar index (new calendar) of each input bar
    new_dates: int
    new_symbols: list[str]
    changed: dict[str, int]       # symbol -> cells changed in existing bars / days
    mode: str                     # "tail", "rewrite" or "none"
    reason: str
    factor_source: str | None     # how adj_factor is obtained after this append (see adjust.factor_source)
    calendar_source: str | None = None   # a --calendar given to this append (recorded in the manifest)
    marks: dict = field(default_factory=dict)   # the exchange followed, days assumed weekdays (manifest keys)


def append(store: str | os.PathLike, inputs: Sequence[str | os.PathLike], *, map: Sequence[str] | None = None,
           user_map: dict[str, str] | None = None, strict: bool = False, dry_run: bool = False,
           wait: float = 0.0, quiet: bool = True, symbol_pattern: str | None = None,
           symbol: str | None = None, na: Sequence[str] = (), skip_bad: bool = False, round_stamps: bool = False,
           exclude: Sequence[str] = (), calendar: str | os.PathLike | None = None,
           assume_weekdays: bool = False,
           date_format: str | None = None, skip_rows: int | None = None, no_header: bool = False,
           columns: Sequence[str] | str | None = None) -> IngestReport:
    """Append new days and symbols from ``inputs`` to the store; apply revisions of stored bars.

    Args:
        store: an existing store directory.
        inputs: files, folders or globs in any format ``ingest`` accepts.
        map / user_map: column mapping (as for ingest).
        strict: data-quality warnings become errors.
        dry_run: compute and report the changes; write nothing.
        wait: seconds to wait for another writer's lock.
        symbol: the symbol of a single input without a symbol column (``--symbol``).
        na, skip_bad, exclude, round_stamps: as for ``ingest``.

    ``inputs`` may be a pandas or polars DataFrame, as for ``ingest``.
        calendar: a file of trading dates listing the new dates of a store built with a calendar file (its
            dates join the store's calendar, as a full ingest with this file would have them), or an exchange
            code (``"XSHG"``): the exchange's sessions, followed by later appends too. A store ingested with
            ``calendar="XSHG"`` or ``sessions="XSHG"`` takes the exchange's next sessions without it.
        assume_weekdays: past the last day whose holidays the installed exchange_calendars records, take the
            exchange's weekdays (holidays unknown; marked in the manifest, and kept by later appends).
        date_format, skip_rows, no_header, columns: as for ``ingest``; without ``date_format``, the store's own
            (recorded by the ingest that used one).

    Returns:
        IngestReport whose ``extra`` says the mode, new dates/symbols and changed cells per symbol.
    """
    read = ReadOptions.of(map=map, user_map=user_map, strict=strict, symbol_pattern=symbol_pattern, symbol=symbol,
                          na=na, skip_bad=skip_bad, exclude=exclude, round_stamps=round_stamps,
                          date_format=date_format, skip_rows=skip_rows, no_header=no_header, columns=columns)
    return append_with(store, inputs, read, AxisOptions(calendar=calendar, assume_weekdays=assume_weekdays),
                       dry_run=dry_run, wait=wait, quiet=quiet)


def append_with(store: str | os.PathLike, inputs, read: ReadOptions, options: AxisOptions, *, dry_run: bool = False,
                wait: float = 0.0, quiet: bool = True) -> IngestReport:
    """``append`` with its options as objects: files, folders, globs or a DataFrame."""
    t0 = time.perf_counter()
    if from_frames.is_frame(inputs):   # read like a file, with every option a file takes
        with from_frames.as_file(inputs, read, _store_zone(store)) as path:
            return append_with(store, [path], read, options, dry_run=dry_run, wait=wait, quiet=quiet)
    if not isinstance(store, (str, os.PathLike)):
        raise InputError(f"store={from_frames.describe(store)}: expected a store directory path "
                         f"(ks.append(store, inputs))")
    store_dir = Path(store)
    head = mf.read_manifest(store_dir)  # a clear error before reading any input if there is no store
    if read.date_format is None and head.get("date_format"):   # the store's --date-format, recorded at ingest
        read = read.replace(date_format=head["date_format"])
    if read.symbol is not None:
        read = read.replace(symbol_pattern=fixed_symbol(read.symbol, expand_inputs(as_input_list(inputs)),
                                                        read.symbol_pattern))
    with dates.exchange_zone(Axis.of(head).timezone) as moved:   # stamps with UTC offsets: to the store's clock
        try:
            bars = read_bars(as_input_list(inputs), read, quiet=quiet)
        except InputError as exc:
            if "--date-format" in str(exc) and read.date_format == head.get("date_format"):
                raise InputError(f"{exc} (the store's, recorded at ingest; pass --date-format FMT for this "
                                 f"file's dates)") from None
            raise
    barsize.check_append(head, bars, store_dir)   # weekly bars into a daily store: no
    calendar = options.calendar
    code = str(calendar).upper() if exchanges.is_code(calendar) else None   # --calendar XSHG: the exchange's sessions
    extra_cal = read_calendar(calendar).astype(np.int64) if calendar is not None and code is None else None
    bars = grid.check_append(head, bars, store_dir, read.skip_bad)   # daily or 5-minute bars into a 1-minute store: no
    daily = head.get("freq", timeaxis.DAILY) == timeaxis.DAILY
    note_moved = dates.moved_note(moved, Axis.of(head).timezone) if daily else None
    if note_moved:
        bars.notes.append(note_moved)
    if extra_cal is not None and not len(extra_cal):
        raise InputError(f"{calendar}: the calendar lists no date")
    exchange = exchanges.Exchange.of(head, code, options.assume_weekdays)
    if dry_run:       # a dry run writes nothing, not even a lock file: it plans on one snapshot
        with open_store(store_dir, verify=False) as old:
            plan, _ = _plan(old, bars, extra_cal, exchange)
            version = old.version
            freq = old.manifest.get("bar") or old.freq
    else:
        with lock.WriterLock(store_dir, wait=wait):
            with open_store(store_dir, verify=False) as old:
                prepare(store_dir, old.manifest)
                plan, rebase = _plan(old, bars, extra_cal, exchange)
                plan.calendar_source = str(calendar) if calendar is not None else None
                if read.date_format:
                    plan.marks["date_format"] = read.date_format
                committed = old.manifest
                try:
                    if plan.mode == "tail":
                        committed = write_tail(store_dir, old, bars, plan, rebase)
                    elif plan.mode == "rewrite":
                        committed = write_rewrite(store_dir, old, bars, plan, rebase)
                finally:
                    clean_staging(store_dir)
            if plan.mode != "none":
                collect(store_dir, committed)   # files and copies no reader pins: a lock probe per file
            version = committed["version"]
            freq = committed.get("bar") or committed.get("freq", "1d")
    cal = timeaxis.stamps(plan.calendar, plan.unit)
    top = sorted(plan.changed.items(), key=lambda kv: -kv[1])
    extra = {
        "mode": (("dry run, would " + plan.mode) if plan.mode != "none" else "dry run: nothing new")
                if dry_run else plan.mode,
        "why": plan.reason,
        "new dates": plan.new_dates,
        "new symbols": f"{len(plan.new_symbols)}" + (f" ({', '.join(plan.new_symbols[:10])}"
                                                     f"{' ...' if len(plan.new_symbols) > 10 else ''})"
                                                     if plan.new_symbols else ""),
        "revised cells": f"{sum(plan.changed.values())} in {len(plan.changed)} symbol(s)" + (
            ": " + ", ".join(f"{k} {v}" for k, v in top[:10]) + (" ..." if len(top) > 10 else "") if top else ""),
    }
    if plan.new_symbols and read.symbol is None and all("symbol" not in s["columns"].values() for s in bars.sources):
        extra["new symbols"] += (", named after the input file name(s): to add the bars to a stored symbol, pass "
                                 "--symbol NAME (symbol=) for one file, or --symbol-pattern")
    return IngestReport(store_dir, version, len(bars.files), len(bars), len(plan.symbols), len(cal),
                        str(cal[0]), str(cal[-1]), plan.fields, bars.problems, bars.skipped_empty,
                        bars.dropped_columns, time.perf_counter() - t0, extra,
                        freq=freq, skipped_files=bars.skipped, notes=list(bars.notes))


def _store_zone(store) -> str | None:
    """The exchange zone a store records (stamps of a DataFrame in several zones are converted to it), if any."""
    try:
        return Axis.of(mf.read_manifest(Path(store))).timezone
    except Exception:   # no store there, or not a path: append_with says so
        return None


def _plan(old: Store, bars: Bars, calendar: np.ndarray | None = None, exchange: exchanges.Exchange | None = None
          ) -> tuple[AppendPlan, dict[str, float]]:
    """Put an appended vendor factor on the store's scale (in place), then plan: both read only."""
    rebase = adjust.rescale_to_store(old, bars.names, bars.sym, bars.keys(Axis.of(old.manifest).unit), bars.values,
                                     bars.fields)
    return plan_append(old, bars, calendar, exchange), rebase


def calendar_file_of(manifest: dict) -> str | None:
    """The calendar file a daily store was built with (``--calendar`` or a Qlib ``day.txt``), else None (its
    calendar is the union of its inputs' dates, a session template, an exchange's, or a resampling)."""
    src = manifest.get("calendar_source")
    if not src or manifest.get("sessions") or str(src).startswith(("union of", "sessions ", "resampled from")):
        return None
    if manifest.get("exchange") or exchanges.code_like(src):   # --calendar XSHG (the code, before "exchange")
        return None
    return str(src)


def _outside(old: Store, bars: Bars, days: np.ndarray, cal: np.ndarray, what: str) -> None:
    """The rule ingest applies: a bar whose key is not in the store's calendar is an error naming it."""
    outside = ~np.isin(days, cal)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        unit = Axis.of(old.manifest).unit
        raise InputError(f"{bars.where(i)}: {bars.names[int(bars.sym[i])]} bar at "
                         f"{timeaxis.show(int(days[i]), unit)} is outside the store's {what} "
                         f"({int(outside.sum())} bar(s) in all)")


def plan_append(old: Store, bars: Bars, calendar: np.ndarray | None = None,
                exchange: exchanges.Exchange | None = None) -> AppendPlan:
    """Decide tail or rewrite, and count what changes. Pure reading: nothing is written."""
    axis = Axis.of(old.manifest)
    exchange = exchange or exchanges.Exchange.of(old.manifest, None, False)
    where = where_day(bars, axis.unit)
    if axis.freq == timeaxis.DAILY and bars.intraday:
        size = timeaxis.detect_freq(np.asarray(bars.minute, dtype=np.int64), np.asarray(bars.sym))
        if size != timeaxis.DAILY:   # several bars of a symbol on one day, not just a varying close stamp
            raise InputError(f"{bars.where(0)}: {size} bars (several a day) for {old.path}, a daily store: "
                             f"ingest them into an intraday store, then resample it to 1d")
    old_days = old.dates.astype(np.int64)   # keys: days, or minutes of an intraday store
    days = bars.keys(axis.unit)
    if axis.freq != timeaxis.DAILY:
        midnight = days % timeaxis.MINUTES_PER_DAY == 0
        if midnight.all() and not (old_days % timeaxis.MINUTES_PER_DAY == 0).any():
            raise InputError(f"{bars.where(0)}: bars without a time of day (daily bars?) for {old.path}, an "
                             f"intraday store ({axis.freq}) with no bar at midnight")
        finer = timeaxis.finer_than(axis.freq, days, np.asarray(bars.sym))
        if finer is not None:
            raise InputError(f"{bars.where(finer)}: bar at {timeaxis.show(int(days[finer]), 'm')} is less than "
                             f"{axis.freq} after the symbol's previous bar: finer than the store's bars")
    if axis.sessions is not None:
        # The input's dates bring every bar of their sessions up to its last bar, and so does the store's last
        # date (it ended at its latest bar): the calendar a full ingest of all the data would have.
        # The input's own stamps are not part of it: a bar outside the sessions is an error, as in ingest.
        if calendar is not None or exchange.given:
            raise InputError("--calendar lists trading dates of daily stores; an intraday store's calendar is its "
                             "sessions")
        span = np.r_[days, old_days[-1:]]
        # --sessions XSHG: its days
        sessions_cal = (exchanges.intraday_calendar(span, axis.exchange, axis.freq, axis.sessions.stamp, where,
                                                    axis.sessions if exchange.assume_weekdays else None)
                        if axis.exchange else sessions.calendar(span, axis.sessions, axis.freq))
        cal = np.union1d(old_days, sessions_cal)
        _outside(old, bars, days, cal, f"sessions ({axis.sessions.name})")
    elif exchange.code is not None and calendar is None:
        # A store that follows an exchange: its next sessions come from exchange_calendars (a calendar file
        # given to this append lists them instead: the way past the library's last covered day).
        if axis.freq != timeaxis.DAILY:
            raise InputError("--calendar lists trading dates of daily stores; for intraday bars use --sessions")
        cal = exchanges.extend_days(exchange.code, old_days, days, where, exchange.assume_weekdays)
        _outside(old, bars, days, cal, f"calendar ({exchange.code} sessions)")
    elif calendar is not None or calendar_file_of(old.manifest) is not None:
        # A store built with a calendar file: its dates are the calendar's, never the input's. New dates come
        # from a calendar the user passes (as a full ingest with that file would have them).
        if calendar is not None and axis.freq != timeaxis.DAILY:
            raise InputError("--calendar lists trading dates of daily stores; for intraday bars use --sessions")
        cal = old_days if calendar is None else np.union1d(old_days, calendar)
        src = calendar_file_of(old.manifest) or "calendar"
        _outside(old, bars, days, cal, f"calendar ({src}" + (" and the --calendar given)" if calendar is not None
                                                             else "; pass --calendar FILE listing new dates)"))
    else:
        cal = np.union1d(old_days, days)
    inserted = len(cal) - len(old_days) - int(np.count_nonzero(cal > (old_days[-1] if len(old_days) else -1 << 40)))
    new_dates = len(cal) - len(old_days)
    pos = np.searchsorted(cal, days)
    known = set(old.symbols)
    new_syms = sorted(s for s in bars.symbols if s not in known)
    symbols = old.symbols + new_syms
    sym = bars.codes_for({s: i for i, s in enumerate(symbols)})
    bars.present_mask(sym, pos, (len(symbols), len(cal)))   # duplicate (symbol, date) check
    in_fields = bars.fields
    new_fields, source = adjust.source_after_append(old.manifest.get("adj_factor_source"), old.fields, in_fields)
    fields = old.fields + new_fields
    # Bars on days the old store already covers: compare with what is stored (revisions). Only values the
    # input has count: an empty cell in a re-sent bar leaves the stored value alone.
    changed: dict[str, int] = {}
    overlap = (sym < old.n_symbols) & np.isin(days, old_days)
    if overlap.any():
        o_pos = np.searchsorted(old_days, days[overlap])
        o_sym = sym[overlap]
        cols = [f for f in in_fields if f in old.fields]
        fidx = [old.fields.index(f) for f in cols]
        stored = np.asarray(old.panel[o_sym[:, None], o_pos[:, None], np.asarray(fidx)[None, :]])
        given = bars.values[overlap][:, [in_fields.index(c) for c in cols]]
        diff = np.isfinite(given) & (stored != given)
        if "adj_factor" in cols:   # a rescaled vendor factor may differ from the stored one in the last bit
            j = cols.index("adj_factor")
            diff[:, j] &= ~np.isclose(given[:, j], stored[:, j], rtol=1e-6, atol=0)
        per_bar = diff.sum(axis=1)
        if per_bar.any():
            counts = np.bincount(o_sym, weights=per_bar, minlength=old.n_symbols)
            changed = {old.symbols[i]: int(counts[i]) for i in np.flatnonzero(counts)}
    if new_dates == 0 and not new_syms and not changed and not new_fields:
        return AppendPlan(cal, axis.unit, symbols, fields, sym, pos, 0, [], {}, "none", "nothing new", source)
    marks = exchange.marks(old.manifest, cal, axis.unit, axis.sessions is None) if calendar is None else {}
    reason = ("revised bars" if changed else f"{inserted} date(s) inserted before the last stored date"
              if inserted else f"new field(s) {', '.join(new_fields)}" if new_fields
              else "date capacity exhausted" if len(cal) > old.date_capacity else "")
    mode = "rewrite" if reason else "tail"
    return AppendPlan(cal, axis.unit, symbols, fields, sym, pos, new_dates, new_syms, changed, mode,
                reason or "new days/symbols only", source, marks=marks)


def write_tail(store_dir: Path, old: Store, bars: Bars, plan: AppendPlan, rebase: dict[str, float]) -> dict:
    """Write new days/rows in place beyond every committed version's view; extend checksums; commit.

    Only cells no committed version can see are written: new days of old rows, and new rows. Bars on stored
    days were found identical by plan_append (else this would be a rewrite) and are not written again.
    """
    m = old.manifest
    n_old_rows, n_old = old.n_symbols, old.n_dates
    n_rows, n_new, nf = len(plan.symbols), len(plan.calendar), len(plan.fields)
    new = (plan.pos >= n_old) | (plan.sym >= n_old_rows)
    fresh = bars.subset(new)
    place = panel.BarPlacement.of(plan.sym[new], plan.pos[new], n_rows)
    with TailAppend(store_dir, m, n_rows, n_new, nf, pinned=old.data_file_identity(), crash="tail") as txn:
        state = _write_tail_blocks(txn, old, fresh, place, plan)
    none = np.iinfo(np.int64).max
    fresh_first = np.full(n_rows, none)
    np.minimum.at(fresh_first, plan.sym[new], plan.pos[new])
    old_first = np.concatenate([old.first_bar, np.full(n_rows - n_old_rows, -1)])
    first = np.where(old_first >= 0, old_first, np.where(fresh_first == none, -1, fresh_first))
    last = np.concatenate([old.last_bar, np.full(n_rows - n_old_rows, -1)])
    np.maximum.at(last, plan.sym[new], plan.pos[new])
    return txn.commit(**_manifest_fields(old, plan, first, last, m["n_bars"] + int(new.sum()), bars, state,
                                         rebase))


def _write_tail_blocks(txn: TailAppend, old: Store, fresh: Bars, place: panel.BarPlacement, plan: AppendPlan
                       ) -> np.ndarray | None:
    """pwrite the new days of old rows and the new rows, a block at a time; returns the event state."""
    n_old_rows, n_old = old.n_symbols, old.n_dates
    n_rows, n_new, nf = len(plan.symbols), len(plan.calendar), len(plan.fields)
    events = plan.factor_source == adjust.EVENTS
    state = None
    if events:
        prev_close, start = adjust.event_state(old)
        state = np.concatenate([start, np.full(n_rows - n_old_rows, np.nan)])
    # (first row, last row, first day): the new days of the old rows, then whole new rows
    for r0, r1, d0 in ((0, n_old_rows, n_old), (n_old_rows, n_rows, 0)):
        if r1 <= r0 or n_new <= d0:
            continue
        step = panel.block_rows(n_new - d0, nf)
        for lo in range(r0, r1, step):
            hi = min(lo + step, r1)
            block = np.full((hi - lo, n_new - d0, nf), np.nan, dtype=np.float32)
            panel.scatter(block, lo, fresh, place, plan.fields, day0=d0)
            if events and d0:
                last = adjust.fill_event_factor(block, plan.fields, prev_close[lo:hi], start[lo:hi])
                state[lo:hi] = np.where(np.isfinite(last), last, start[lo:hi])
            elif events:
                state[lo:hi] = adjust.fill_event_factor(block, plan.fields)
            txn.write(lo, block, d0)
    return state


def write_rewrite(store_dir: Path, old: Store, bars: Bars, plan: AppendPlan, rebase: dict[str, float]) -> dict:
    """Copy-on-write: a new generation with the old cells moved to their (new) calendar positions, the revised
    bars laid over them, built and written a block of rows at a time."""
    m = old.manifest
    n_rows, n_new, nf = len(plan.symbols), len(plan.calendar), len(plan.fields)
    old_pos = np.searchsorted(plan.calendar, old.dates.astype(np.int64))
    place = panel.BarPlacement.of(plan.sym, plan.pos, n_rows)
    events = plan.factor_source == adjust.EVENTS
    state = np.full(n_rows, np.nan) if events else None
    present_rows = []
    with NewVersion(store_dir, n_rows, n_new, nf, crash="rewrite", after=m) as txn:
        step = panel.block_rows(n_new, nf)
        for lo in range(0, n_rows, step):
            hi = min(lo + step, n_rows)
            block = np.full((hi - lo, n_new, nf), np.nan, dtype=np.float32)
            stored = max(0, min(hi, old.n_symbols) - lo)
            if stored:
                block[:stored][:, old_pos, : old.n_fields] = old.panel[lo: lo + stored]
            # Revised bars replace the values the input has; empty cells and fields it lacks keep what is stored.
            panel.scatter(block, lo, bars, place, plan.fields, keep_stored=True)
            if events:
                state[lo:hi] = adjust.refill_events(block, plan.fields)
            present_rows.append(np.isfinite(block).any(axis=2))
            txn.write(lo, block)
        txn.finish()
        present = np.concatenate(present_rows) if present_rows else np.zeros((0, n_new), bool)
        first, last = bar_extent(present)
        return txn.commit(created_at=txn.created_at,
                          **_manifest_fields(old, plan, first, last, int(present.sum()), bars, state, rebase))


def _manifest_fields(old: Store, plan: AppendPlan, first: np.ndarray, last: np.ndarray, n_bars: int, bars: Bars,
                     factor_state: np.ndarray | None, rebase: dict[str, float]) -> dict:
    """The new version's manifest fields (``build_manifest``'s keywords but version, data, capacity and
    created_at, which the transaction fills in)."""
    m = old.manifest
    extra = {**Axis.of(m).manifest(), "calendar_source": plan.calendar_source or m.get("calendar_source"),
             "adj_factor_source": plan.factor_source, **universes.carried(m),   # spans are dates: kept as they are
             **{k: m[k] for k in ("assumed_weekdays", "date_format") if m.get(k)}, **plan.marks,
             mf.STORE_ID_KEY: m.get(mf.STORE_ID_KEY)}                          # None: commit gives it one
    if plan.factor_source == adjust.INPUT:
        extra["adj_rebase"] = [rebase.get(s) for s in plan.symbols]
    if factor_state is not None:
        extra["adj_last_factor"] = adjust.state_list(factor_state)
    return dict(symbols=plan.symbols, dates=timeaxis.stamps(plan.calendar, Axis.of(m).unit), fields=plan.fields,
                first_bar=first, last_bar=last, n_bars=n_bars, sources=list(m.get("sources", [])) + bars.sources,
                extra=extra)
