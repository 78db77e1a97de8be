"""Daily operation: add new days and new symbols to a store, and apply revised bars.

Two ways to write, chosen per append:

* **tail** (the daily case, cost proportional to the new data): new days land in the reserved room after each
  symbol row, new symbols become new rows at the end of the file, and row checksums are extended
  incrementally. No byte that any committed version can see is modified, so open readers keep their snapshot
  and a killed append leaves the previous version intact.
* **rewrite** (history changes): revised cells, dates inserted inside or before the calendar, new fields or
  exhausted capacity write a new generation file (copy-on-write), then swap the manifest.

Alignment is always by calendar date, never by a symbol's own row order: a symbol suspended on a new day gets
NaN on exactly that day. Symbols keep their row for life (new listings are added at the end), so symbol
indices stay valid across versions.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from . import adjust, columns as C, lock, manifest as mf, store as S
from .convert import EPOCH, Bars, IngestReport, factor_state_list, fill_event_factor, read_bars, scatter

EVENT_FACTOR = "events"


@dataclass
class Plan:
    """What an append will do, computed before anything is written."""

    calendar: np.ndarray          # new calendar, int32 days since epoch
    symbols: list[str]            # old symbols, then new ones in sorted order
    fields: list[str]             # old fields, then new ones
    sym: np.ndarray               # row of each input bar
    pos: np.ndarray               # calendar index (new calendar) of each input bar
    new_dates: int
    new_symbols: list[str]
    changed: dict[str, int]       # symbol -> cells changed in existing bars / days
    mode: str                     # "tail", "rewrite" or "none"
    reason: str
    factor_source: str | None     # how adj_factor is obtained after this append (see convert.factor_source)


def append(store: str | os.PathLike, inputs: Sequence[str | os.PathLike], *, map: Sequence[str] | None = None,
           user_map: dict[str, str] | None = None, strict: bool = False, dry_run: bool = False,
           wait: float = 0.0, quiet: bool = True, symbol_pattern: str | None = None) -> IngestReport:
    """Append new days and symbols from ``inputs`` to the store; apply revisions of stored bars.

    Args:
        store: an existing store directory.
        inputs: files, folders or globs in any format ``ingest`` accepts.
        map / user_map: column mapping (as for ingest).
        strict: data-quality warnings become errors.
        dry_run: compute and report the changes; write nothing.
        wait: seconds to wait for another writer's lock.

    Returns:
        IngestReport whose ``extra`` says the mode, new dates/symbols and changed cells per symbol.
    """
    t0 = time.perf_counter()
    store_dir = Path(store)
    mf.read_manifest(store_dir)  # a clear error before reading any input if there is no store
    umap = dict(user_map or {})
    umap.update(C.parse_mapping(map))
    bars = read_bars(inputs, user_map=umap, strict=strict, quiet=quiet, symbol_pattern=symbol_pattern)
    with lock.WriterLock(store_dir, wait=wait):
        old = S.open_store(store_dir, verify=False)
        try:
            rebase = rebase_input_factor(old, bars)
            plan = make_plan(old, bars)
            if dry_run or plan.mode == "none":
                version = old.version
            elif plan.mode == "tail":
                version = write_tail(store_dir, old, bars, plan, rebase)
            else:
                version = write_rewrite(store_dir, old, bars, plan, rebase)
        finally:
            old.close()
        S.clean_staging(store_dir)
    if not dry_run and plan.mode != "none":
        S.gc(store_dir)   # old files and version copies no reader pins (cheap: a lock probe per file)
    cal = EPOCH + plan.calendar.astype("timedelta64[D]")
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
    return IngestReport(store_dir, version, len(bars.files), len(bars), len(plan.symbols), len(cal),
                        str(cal[0]), str(cal[-1]), plan.fields, bars.problems, bars.skipped_empty,
                        bars.dropped_columns, time.perf_counter() - t0, extra)


def rebase_input_factor(old: S.Store, bars: Bars) -> dict[str, float]:
    """Put a vendor ``adj_factor`` in the input on the store's scale (in place); returns symbol -> divisor.

    The store keeps vendor factors rebased to 1 at each symbol's first bar (see adjust.rebase). An input's
    factor is divided by: the ratio to the stored factor on the first day both have (a Yahoo re-download,
    whose scale moved with later dividends); else the symbol's stored divisor (tushare's absolute factor);
    else, for a new symbol, its own first factor.
    """
    source = old.manifest.get("adj_factor_source")
    first_factor = source is None and "adj_factor" not in old.fields   # a vendor factor arrives now
    if (source != "input" and not first_factor) or "adj_factor" not in bars.fields:
        return {k: v for k, v in zip(old.symbols, old.manifest.get("adj_rebase") or []) if v is not None}
    # Stores written before rebasing existed keep their factors as given: divisor 1.
    stored_div = dict(zip(old.symbols, old.manifest.get("adj_rebase") or [1.0] * old.n_symbols))
    if first_factor:
        stored_div = {}
    fi = bars.fields.index("adj_factor")
    given = bars.values[:, fi].astype(np.float64)
    old_days = (old.dates - EPOCH).astype(np.int64)
    order = np.lexsort((bars.day, bars.sym))            # each symbol's bars by date
    starts = np.flatnonzero(np.r_[True, np.diff(bars.sym[order]) != 0])
    divisors: dict[str, float] = {k: v for k, v in stored_div.items() if v is not None}
    for run in np.split(order, starts[1:]):
        name = bars.names[int(bars.sym[run[0]])]
        g = given[run]
        scale = np.nan
        if name in stored_div:
            row = old.symbol_index(name)
            pos = np.searchsorted(old_days, bars.day[run])
            on_old = (pos < len(old_days)) & (old_days[np.minimum(pos, len(old_days) - 1)] == bars.day[run])
            if on_old.any():
                stored = old.panel[row, pos[on_old], old.field_index("adj_factor")].astype(np.float64)
                both = np.isfinite(stored) & np.isfinite(g[on_old]) & (stored > 0)
                if both.any():
                    k = int(np.argmax(both))
                    scale = g[on_old][k] / stored[k]
                    known = stored_div[name]
                    if known is not None and abs(scale / known - 1) < 1e-5:
                        scale = known   # the same scale, up to float32 rounding of the stored factor
            if not np.isfinite(scale):
                scale = stored_div[name] if stored_div[name] is not None else np.nan
        if not np.isfinite(scale):
            fin = g[np.isfinite(g)]
            scale = fin[0] if fin.size else np.nan
            if np.isfinite(scale):
                divisors[name] = float(scale)
        if np.isfinite(scale) and scale > 0:
            bars.values[run, fi] = (g / scale).astype(np.float32)
    return divisors


def make_plan(old: S.Store, bars: Bars) -> Plan:
    """Decide tail or rewrite, and count what changes. Pure reading: nothing is written."""
    old_days = (old.dates - EPOCH).astype(np.int64)
    days = bars.day.astype(np.int64)
    cal = np.union1d(old_days, days)
    inserted = len(cal) - len(old_days) - int(np.count_nonzero(cal > (old_days[-1] if len(old_days) else -1 << 40)))
    new_dates = len(cal) - len(old_days)
    pos = np.searchsorted(cal, days)
    in_symbols = bars.symbols
    known = set(old.symbols)
    new_syms = sorted(s for s in in_symbols if s not in known)
    symbols = old.symbols + new_syms
    index = {s: i for i, s in enumerate(symbols)}
    sym = bars.codes_for(index)
    bars.present_mask(sym, pos, (len(symbols), len(cal)))   # duplicate (symbol, date) check
    in_fields = bars.fields
    new_fields = [f for f in in_fields if f not in old.fields]
    source = old.manifest.get("adj_factor_source")
    if source is None and "adj_factor" in new_fields:
        source = "input"                       # a vendor factor arrives for the first time
    split, div = adjust.event_columns(old.fields + new_fields)
    if (split or div) and "adj_factor" not in old.fields + new_fields:
        new_fields.append("adj_factor")        # events arrive for the first time: as a full ingest would
        source = EVENT_FACTOR
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
        return Plan(cal, symbols, fields, sym, pos, 0, [], {}, "none", "nothing new", source)
    reason = ("revised bars" if changed else f"{inserted} date(s) inserted before the last stored date"
              if inserted else f"new field(s) {', '.join(new_fields)}" if new_fields
              else "date capacity exhausted" if len(cal) > old.date_capacity else "")
    mode = "rewrite" if reason else "tail"
    return Plan(cal, symbols, fields, sym, pos, new_dates, new_syms, changed, mode,
                reason or "new days/symbols only", source)


def _event_state(old: S.Store) -> tuple[np.ndarray, np.ndarray]:
    """Last close and last float64 factor per row: where event-based factors continue from.

    Reads one cell per symbol (its last bar), not the close history: the cost of a daily append stays
    proportional to the new data.
    """
    from .adjust import last_finite
    close = np.full(old.n_symbols, np.nan)
    fc = old.field_index("close")
    rows = np.flatnonzero(old.last_bar >= 0)
    if rows.size:   # the last finite close: look a few days back from each last bar, all history if needed
        lo = np.maximum(old.last_bar[rows] - 31, 0)
        span = lo[:, None] + np.arange(32)[None, :]
        recent = old.panel[rows[:, None], np.minimum(span, old.n_dates - 1), fc]
        recent = np.where(span <= old.last_bar[rows][:, None], recent, np.nan)
        close[rows] = last_finite(recent)
        missing = rows[~np.isfinite(close[rows])]
        if missing.size:
            close[missing] = last_finite(np.asarray(old.panel[missing, :, fc]))
    state = old.manifest.get("adj_last_factor") or [None] * old.n_symbols
    return close, np.array([np.nan if x is None else x for x in state], dtype=np.float64)


def write_tail(store_dir: Path, old: S.Store, bars: Bars, plan: Plan, rebase: dict[str, float]) -> int:
    """Write new days/rows in place beyond every committed version's view; extend checksums; commit."""
    m = old.manifest
    n_old_rows, n_old = old.n_symbols, old.n_dates
    n_rows, n_new, nf = len(plan.symbols), len(plan.calendar), len(plan.fields)
    cap = old.date_capacity
    path = old.data_file
    size = n_rows * cap * nf * 4
    if os.path.getsize(path) < size:
        os.truncate(path, size)
    mm = np.memmap(path, dtype=np.float32, mode="r+", shape=(n_rows, cap, nf))
    # Only cells no committed version can see: new days of old rows, and new rows. Bars on stored days were
    # found identical by make_plan (else this would be a rewrite) and are not written again.
    new = (plan.pos >= n_old) | (plan.sym >= n_old_rows)
    mf.crashpoint("tail:grown")
    mm[:n_old_rows, n_old:n_new, :] = np.nan
    mm[n_old_rows:, :n_new, :] = np.nan
    mf.crashpoint("tail:cleared")
    scatter(bars.subset(new), plan.sym[new], plan.pos[new], plan.fields, mm)
    mf.crashpoint("tail:written")
    state = None
    if plan.factor_source == EVENT_FACTOR:
        state = _extend_event_factor(mm, old, plan.fields, n_old_rows, n_old, n_rows, n_new)
    old_crc = np.asarray(m["data"]["row_crc32"][:n_old_rows], dtype=np.uint32)
    crcs = np.concatenate([mf.row_crcs(mm[:n_old_rows, n_old:n_new, :], old_crc),
                           mf.row_crcs(mm[n_old_rows:, :n_new, :])]).astype(np.uint32)
    del mm
    with open(path, "rb+") as fh:
        # fsync writes back the pages dirtied through the mapping too (one page cache); cheaper than
        # msync over the whole (mostly reserved) mapping. Data is durable before the manifest that shows it.
        os.fsync(fh.fileno())
    none = np.iinfo(np.int64).max
    fresh_first = np.full(n_rows, none)
    np.minimum.at(fresh_first, plan.sym[new], plan.pos[new])
    old_first = np.concatenate([old.first_bar, np.full(n_rows - n_old_rows, -1)])
    first = np.where(old_first >= 0, old_first, np.where(fresh_first == none, -1, fresh_first))
    last = np.concatenate([old.last_bar, np.full(n_rows - n_old_rows, -1)])
    np.maximum.at(last, plan.sym[new], plan.pos[new])
    data = dict(m["data"], rows=n_rows, size=size, row_crc32=crcs.tolist(), checksum=mf.file_checksum(crcs))
    return _commit(store_dir, old, plan, data, cap, first, last, m["n_bars"] + int(new.sum()), bars, state,
                   rebase)


def _extend_event_factor(mm: np.ndarray, old: S.Store, fields: list[str], n_old_rows: int, n_old: int,
                         n_rows: int, n_new: int) -> np.ndarray:
    """Continue split/dividend factors into the new days and rows; returns the new per-row factor state."""
    fi = fields.index("adj_factor")
    prev_close, start = _event_state(old)
    state = np.concatenate([start, np.full(n_rows - n_old_rows, np.nan)])
    if n_new > n_old and n_old_rows:
        block = np.array(mm[:n_old_rows, n_old:n_new, :])
        block[:, :, fi] = np.nan
        last = fill_event_factor(block, fields, prev_close, start)
        mm[:n_old_rows, n_old:n_new, fi] = block[:, :, fi]
        state[:n_old_rows] = np.where(np.isfinite(last), last, start)
    if n_rows > n_old_rows:
        rows = np.array(mm[n_old_rows:, :n_new, :])
        rows[:, :, fi] = np.nan
        state[n_old_rows:] = fill_event_factor(rows, fields)
        mm[n_old_rows:, :n_new, fi] = rows[:, :, fi]
    return state


def write_rewrite(store_dir: Path, old: S.Store, bars: Bars, plan: Plan, rebase: dict[str, float]) -> int:
    """Copy-on-write: a new generation with the old cells moved to their (new) calendar positions."""
    m = old.manifest
    n_rows, n_new, nf = len(plan.symbols), len(plan.calendar), len(plan.fields)
    gen = S.start_generation(store_dir, m["data"]["generation"] + 1, n_rows, n_new, nf)
    panel = gen.logical()
    old_pos = np.searchsorted(plan.calendar, (old.dates - EPOCH).astype(np.int64))
    src = old.panel
    for lo in range(0, old.n_symbols, 256):  # bounded memory: 256 rows at a time
        hi = min(lo + 256, old.n_symbols)
        panel[lo:hi, old_pos, : old.n_fields] = src[lo:hi]
    # Revised bars replace the values the input has; empty cells and fields it lacks keep what is stored.
    fidx = np.asarray([plan.fields.index(f) for f in bars.fields])
    at = (plan.sym[:, None], plan.pos[:, None], fidx[None, :])
    panel[at] = np.where(np.isfinite(bars.values), bars.values, panel[at])
    state = None
    if plan.factor_source == EVENT_FACTOR:
        panel[:, :, plan.fields.index("adj_factor")] = np.nan
        state = fill_event_factor(panel, plan.fields)
    present = np.isfinite(panel).any(axis=2)
    first, last = S.bar_extent(present)
    mf.crashpoint("rewrite:filled")
    data = S.finish_generation(store_dir, gen)
    mf.crashpoint("rewrite:data-in-place")
    return _commit(store_dir, old, plan, data, gen.capacity, first, last, int(present.sum()), bars,
                   state, rebase)


def _commit(store_dir: Path, old: S.Store, plan: Plan, data: dict, cap: int, first: np.ndarray,
            last: np.ndarray, n_bars: int, bars: Bars, factor_state: np.ndarray | None = None,
            rebase: dict[str, float] | None = None) -> int:
    m = old.manifest
    extra = {"calendar_source": m.get("calendar_source"), "adj_factor_source": plan.factor_source}
    if plan.factor_source == "input":
        extra["adj_rebase"] = [(rebase or {}).get(s) for s in plan.symbols]
    if factor_state is not None:
        extra["adj_last_factor"] = factor_state_list(factor_state)
    new = S.build_manifest(version=old.version + 1, data=data, symbols=plan.symbols,
                           dates=EPOCH + plan.calendar.astype("timedelta64[D]"), fields=plan.fields,
                           capacity=cap, first_bar=first, last_bar=last, n_bars=n_bars,
                           sources=list(m.get("sources", [])) + bars.sources, created_at=m.get("created_at"),
                           extra=extra)
    mf.commit(store_dir, new)
    return new["version"]
