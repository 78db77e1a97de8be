"""A features store from a bar store: every expression of a plan over the panel, a block of symbols at a time,
written like an ingest (staging, row checksums, an atomic manifest swap), and kept current by tail appends.

Spans: Qlib's series of an instrument starts at its first bar; rows before it are absent. Its end is the end
of the calendar: a symbol suspended on the latest days keeps its rows (NaN bars) so that an append that
resumes it never changes a stored cell. On every cell Qlib returns (days up to the instrument's last bar) this
gives Qlib's values: past its last bar a look-ahead reads NaN either way.

Update: the base store's appends keep its data file (a tail append); the features store then computes only the
new bars, reading back the longest window it needs, and writes them after each row's stored days, where no
committed version looks. Anything else (the base rewritten: a revision, an insertion, new fields; a feature
reading the whole series; no room left) is a full recompute, said so in the report.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ..errors import InputError, StoreError
from ..memory import Available, available, gib
from ..progress import Progress, silenced
from ..store import (NewVersion, TailAppend, clean_failed_write, clean_staging, identity, lock, manifest as mf, prepare,
                     reclaim, safefs, whole_store)
from ..store.snapshot import Store, open_store
from .cross_section import crossing, restrict
from .pagecache import DropBehind
from .evaluate import evaluate
from .nodes import Node, fields_of
from .plan import FIELD_ALIASES, META_KEY, FeaturePlan, make_plan, plan_from_manifest
from .stages import MEMBERS, stage

# Bytes of working memory one block of symbols may take (inputs, every live intermediate, outputs): bounds the
# process however large the output store is. Less where less is available (a cgroup's limit included): a share
# of what this process may still take (block_budget).
BLOCK_BYTES = 512 << 20
BUDGET_SHARE = 0.5                 # of the available memory: the rest for the allocator's slack and the page cache
MIN_BLOCK_BYTES = 16 << 20         # below this, refused in one line rather than run into the OOM killer


@dataclass
class FeatureReport:
    """What a features run did."""

    out: Path
    mode: str                     # "full", "tail" or "none"
    reason: str                   # why a full recompute, when an update asked for one
    n_symbols: int
    n_dates: int
    fields: list[str]
    new_bars: int                 # symbol-days computed
    seconds: float
    device: str
    missing_fields: list[str] = field(default_factory=list)
    version: int = 0
    missing_readers: list[str] = field(default_factory=list)   # the features that read a missing field

    def lines(self) -> list[str]:
        what = {"full": "computed", "tail": "appended", "none": "up to date"}[self.mode]
        out = [f"features {self.out}: {what}: {len(self.fields)} fields x {self.n_symbols} symbols x "
               f"{self.n_dates} dates ({self.new_bars:,} symbol-days computed on {self.device} in "
               f"{self.seconds:.2f} s; version {self.version})"]
        if self.reason:
            out.append(f"note: full recompute: {self.reason}")
        if self.missing_fields:
            readers = self.missing_readers
            plural = "s" if len(readers) != 1 else ""
            which = (f" ({len(readers)} feature{plural}: {', '.join(readers[:8])}{', ...' if len(readers) > 8 else ''})"
                     if readers else "")
            out.append(f"warning missing_field: the store has no {', '.join('$' + f for f in self.missing_fields)}"
                       f": expressions reading it{which} read NaN, as in Qlib (a comparison with NaN is 0, so "
                       "such a feature may be 0 rather than NaN)")
        return out


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"device={device!r}: expected 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {str(dev)!r} requested but CUDA is not available; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"device {str(dev)!r}: expected 'cpu' or a CUDA device")
    return dev


def _sources(st: Store, plan: FeaturePlan) -> tuple[dict[str, int], list[str]]:
    """Store field index of each input the expressions read, and the inputs the store lacks."""
    index, missing = {}, []
    for name in sorted(plan.inputs()):
        stored = name if name in st.fields else FIELD_ALIASES.get(name)
        if stored in st.fields:
            index[name] = st.fields.index(stored)
        else:
            missing.append(name)
    return index, missing


def symbol_bytes(n_dates: int, plan: FeaturePlan) -> int:
    """Working memory of one symbol's block: its outputs (float32; the stored layout is placed a few symbols at
    a time, see ``placed``) and the live intermediates per bar: operands and what the pass keeps of them for
    other operators (window sums, extremes, fits of each window length; about 250 float64 on Alpha158:
    measured 2,605 bytes a symbol-day in all on the real panel, against 2,684 here)."""
    return max(1, n_dates) * (len(plan.fields) * 4 + 256 * 8)


def block_budget(avail: Available | None = None) -> int:
    """Bytes one block may take: BLOCK_BYTES, or BUDGET_SHARE of what this process may still use when less."""
    avail = available() if avail is None else avail
    return min(BLOCK_BYTES, int(avail.nbytes * BUDGET_SHARE))


def block_rows(n_dates: int, plan: FeaturePlan, budget: int | None = None, block: int | None = None) -> int:
    """Symbols per block: ``block`` (the caller's block_symbols) or what fits in the budget (default:
    block_budget()). Raises InputError in one line, before anything is written, when even one symbol's block
    (or MIN_BLOCK_BYTES) exceeds the budget."""
    avail = available() if budget is None else None
    budget = block_budget(avail) if budget is None else budget
    need = max(MIN_BLOCK_BYTES, symbol_bytes(n_dates, plan))
    if need > budget:
        where = f"{avail}, {BUDGET_SHARE:.0%} of it for a block" if avail is not None else "the budget"
        raise InputError(f"features: a block of one symbol ({n_dates:,} dates x {len(plan.fields)} expressions) needs "
                         f"{gib(need)}; {gib(budget)} is what fits ({where}); free memory, raise the memory "
                         "limit or compute fewer expressions at a time")
    return block or max(1, budget // symbol_bytes(n_dates, plan))


def check_block_symbols(block_symbols) -> int | None:
    """block_symbols as given: None or a positive int; anything else refused in one line."""
    if block_symbols is None or (type(block_symbols) is int and block_symbols > 0):
        return block_symbols
    if isinstance(block_symbols, np.integer) and block_symbols > 0:
        return int(block_symbols)
    raise InputError(f"block_symbols={block_symbols!r}: expected a positive whole number of symbols per block "
                     "(or None for what fits in memory)")


def spans(st: Store, d0: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) of each symbol's series relative to calendar index ``d0``: from its first bar to the end
    of the calendar; empty (first > last) for a symbol without bars."""
    first = st.first_bar.astype(np.int64)
    has = first >= 0
    return np.where(has, first - d0, st.n_dates), np.where(has, st.n_dates - 1 - d0, -1)


@dataclass(frozen=True)
class Cross:
    """A plan's cross-sectional operators evaluated over every symbol (stages.py): the plan's expressions with
    those nodes replaced by pseudo-fields, and the pseudo-fields' (and universe members') values, [symbols, days
    d0 ..]. A block pass reads its rows of them."""

    exprs: dict[str, Node]
    values: dict[str, torch.Tensor]


def _block(st: Store, rows: slice, d0: int, exprs: dict[str, Node], index: dict[str, int], device: torch.device,
           extra: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
           threads: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    block = np.asarray(st.panel[rows, d0:])            # [rows, days, n_fields]: one read of the rows' bytes
    values = {name: torch.from_numpy(np.ascontiguousarray(block[:, :, k])).to(device)
              for name, k in index.items()}
    values.update({name: v[rows] for name, v in extra.items()})
    if not values:                                     # nothing the store has: every field reads NaN
        values = {"__none__": torch.full(block.shape[:2], float("nan"), device=device)}
    first, last = spans(st, d0)
    ev = evaluate(exprs, values, torch.from_numpy(first[rows]), torch.from_numpy(last[rows]), dtype=dtype,
                  threads=threads, out=out)
    return ev.values.permute(2, 0, 1)                  # evaluate's own layout: no copy


def evaluate_block(st: Store, rows: slice, d0: int, plan: FeaturePlan, index: dict[str, int],
                   device: torch.device, cross: Cross | None = None, threads: int | None = None,
                   out: torch.Tensor | None = None) -> np.ndarray:
    """Every field of ``plan`` for the symbol ``rows`` over calendar days ``d0 ..``, expression-major
    [fields, rows, days] float32, each at the day it describes (not yet shifted). A plan with cross-sectional
    operators needs ``cross`` (cross_inputs) for the same ``d0``. threads: evaluate's. out: a buffer the
    previous block's values were in, reused when large enough (a fresh one each block is fresh memory to
    fault in: kernel time, most of all on a virtual machine)."""
    exprs = cross.exprs if cross is not None else {f.name: f.node for f in plan.fields}
    return _block(st, rows, d0, exprs, index, device, cross.values if cross is not None else {},
                  threads=threads, out=out).cpu().numpy()


def cross_inputs(st: Store, plan: FeaturePlan, index: dict[str, int], device: torch.device, rows: int,
                 d0: int = 0) -> Cross | None:
    """The plan's cross-sectional operators over every symbol on days ``d0 ..`` (blocks of ``rows`` symbols for
    their operands), over the members of ``plan.universe`` when it names one; None for a plan without them."""
    nodes = {f.name: f.node for f in plan.fields}
    if not any(crossing(n) for n in nodes.values()):
        return None
    values: dict[str, torch.Tensor] = {}
    if plan.universe is not None:
        inside = st.membership(plan.universe).mask(None, d0, st.n_dates)
        values[MEMBERS.name] = torch.from_numpy(np.where(inside, 1.0, np.nan).astype(np.float32)).to(device)
        nodes = {name: restrict(n, MEMBERS) for name, n in nodes.items()}

    def run(operands: dict[str, Node], pseudo: dict[str, torch.Tensor]) -> torch.Tensor:
        extra = {**values, **pseudo}
        return torch.cat([_block(st, slice(lo, min(lo + rows, st.n_symbols)), d0, operands, index, device, extra,
                                 torch.float64) for lo in range(0, st.n_symbols, rows)], dim=1)
    operands = max(2, BLOCK_BYTES // max(1, 8 * st.n_symbols * (st.n_dates - d0)))   # float64 panels a call
    roots, pseudo = stage(list(nodes.values()), run, operands)
    return Cross(dict(zip(nodes, roots)), {**values, **pseudo})


def universe_digest(st: Store, name: str | None) -> str | None:
    """A hash of universe ``name``'s spans as the store records them (open spans stay open across appends)."""
    if name is None:
        return None
    st.membership(name)                                # a one-line error naming the universes there are
    return hashlib.sha256(json.dumps(st.manifest["universes"][name], sort_keys=True).encode()).hexdigest()[:16]


# Symbols a step of the layout copy takes: [fields, 4, days] -> [4, days, fields] stays in the caches, where
# a field at a time writes every symbol's row with a stride of a whole cell (2.6x slower on the real panel).
# The step is also what the writer gets at a time: its pwrite and row checksums read the cells while they are
# still cached, and one small buffer is reused instead of a second copy of the whole block (page faults).
_PLACE_SYMBOLS = 4


def _runs(plan: FeaturePlan) -> list[tuple[int, int, int]]:
    """(k0, k1, lookahead): consecutive fields that look equally far ahead (Alpha158: one run and the label)."""
    runs: list[tuple[int, int, int]] = []
    for k, f in enumerate(plan.fields):
        if runs and runs[-1][2] == f.lookahead and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1, f.lookahead)
        else:
            runs.append((k, k + 1, f.lookahead))
    return runs


def placed(vals: np.ndarray, d0: int, u0: int, u1: int, plan: FeaturePlan,
           step: int = _PLACE_SYMBOLS) -> Iterator[tuple[int, np.ndarray]]:
    """Stored cells ``u0 .. u1`` (calendar indices) from expression-major values computed for days ``d0 ..``,
    ``step`` symbols at a time: (first row, cells [rows, days, fields]). A field that looks ``a`` bars ahead
    is stored at the day ``a`` bars after the one it describes (NaN before that). A blocked transpose into one
    buffer, reused: write (or copy) each piece before taking the next."""
    n_rows = vals.shape[1]
    buf = np.empty((min(step, n_rows), u1 - u0, vals.shape[0]), dtype=np.float32)
    runs = [(k0, k1, min(u1, max(u0, d0 + ahead)), ahead) for k0, k1, ahead in _runs(plan)]
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        out = buf[: r1 - r0]
        for k0, k1, lo, ahead in runs:             # lo: first cell whose described day was computed
            out[:, : lo - u0, k0:k1] = np.nan
            if lo < u1:
                out[:, lo - u0:, k0:k1] = vals[k0:k1, r0:r1, lo - ahead - d0: u1 - ahead - d0].transpose(1, 2, 0)
        yield r0, out


def place_cells(vals: np.ndarray, d0: int, u0: int, u1: int, plan: FeaturePlan) -> np.ndarray:
    """``placed``'s pieces as one array [rows, days, fields]."""
    out = np.empty((vals.shape[1], u1 - u0, vals.shape[0]), dtype=np.float32)
    for r0, cells in placed(vals, d0, u0, u1, plan):
        out[r0: r0 + len(cells)] = cells
    return out


def _meta(st: Store, plan: FeaturePlan) -> dict:
    source = identity.record(st)                               # what --update checks before it appends
    if plan.universe is not None:
        source["universe_digest"] = universe_digest(st, plan.universe)
    return {**plan.manifest(), "source": source}


def time_axis(st: Store) -> dict:
    """What a derived store keeps of its source's manifest: bar size, sessions, calendar source, universes."""
    return {k: st.manifest[k] for k in ("freq", "sessions", "calendar_source", "universes")
            if st.manifest.get(k) is not None}


def _extra(st: Store, plan: FeaturePlan, store_id: str | None = None) -> dict:
    """The features manifest's own keys; ``store_id``: a new store's, or the store's own (None: commit reads it)."""
    return {**time_axis(st), META_KEY: _meta(st, plan), **({mf.STORE_ID_KEY: store_id} if store_id else {})}


def source_entry(st: Store, key: str) -> dict:
    """The ``sources`` entry of a store derived from ``st``: its path, id and version."""
    return {key: str(st.path.resolve()), mf.STORE_ID_KEY: identity.store_id(st.manifest), "version": st.version}


def _write_full(out: Path, st: Store, plan: FeaturePlan, device: torch.device, block: int | None,
                capacity: int | None, store_id: str | None = None,
                threads: int | None = None) -> tuple[dict, list[str]]:
    """A new generation of ``out`` with every field of every symbol (under the caller's lock); ``store_id``:
    a new store's id (None: an update keeps the store's)."""
    index, missing = _sources(st, plan)
    rows = block_rows(st.n_dates, plan, block=block)
    with NewVersion(out, st.n_symbols, st.n_dates, len(plan.fields), capacity or st.date_capacity,
                    crash="features") as txn:
        cross = cross_inputs(st, plan, index, device, rows)
        drop_behind = DropBehind(txn.gen.fd, txn.gen.stride, st.n_symbols * st.n_dates * len(plan.fields) * 4)
        buffer = torch.from_numpy(np.empty((len(plan.fields), min(rows, st.n_symbols), st.n_dates), np.float32)) \
            if device.type == "cpu" else None         # every block's values: one allocation, not one a block
        for lo in range(0, st.n_symbols, rows):
            sl = slice(lo, min(lo + rows, st.n_symbols))
            vals = evaluate_block(st, sl, 0, plan, index, device, cross, threads, buffer)
            for r0, cells in placed(vals, 0, 0, st.n_dates, plan):
                txn.write(lo + r0, cells)
            drop_behind.written(lo, sl.stop)
        m = txn.commit(symbols=st.symbols, dates=st.dates, fields=plan.names, first_bar=st.first_bar,
                       last_bar=st.last_bar, n_bars=st.manifest["n_bars"], created_at=txn.created_at,
                       sources=[source_entry(st, "features_of")], extra=_extra(st, plan, store_id))
    return m, missing


def compute_features(store: str | os.PathLike | Store, out: str | os.PathLike, sets=("alpha158",), exprs=None,
                     label: str | None = "default", files=(), device: str = "cpu", *, replace: bool = False,
                     wait: float = 0.0, block_symbols: int | None = None, quiet: bool = True,
                     universe: str | None = None, threads: int | None = None) -> FeatureReport:
    """Compute a features store at ``out`` from the bar store ``store``.

    Args:
        store: the bar store (a path or an open Store).
        out: the features store to write: same symbols, calendar and bar size, one field per feature plus the
            label. An existing store there is replaced only with ``replace``.
        sets: named sets ("alpha158", "alpha360"). exprs: ``{name: expr}`` or ``["NAME=EXPR"]``.
        label: "default" (Qlib's LABEL0 = Ref($close, -2)/Ref($close, -1) - 1), None, an expression, or
            ``NAME=EXPR``. files: files of ``NAME=EXPR`` lines.
        device: "cpu" or a CUDA device: where the blocks are computed.
        block_symbols: symbols per block, a positive int (default: what fits in block_budget(): BLOCK_BYTES, or
            half the memory this process may still take, a cgroup's limit included, when that is less).
        universe: a universe of the store: cross-sectional operators (CSRank, ...) over its members of each
            day, NaN for the other symbols (the other operators see every symbol, as Qlib's series do).
        threads: CPU threads, each computing its own symbols with one torch thread (default:
            torch.get_num_threads()); the values do not depend on it.

    Raises:
        InputError: a bad expression or set, a target in the way; StoreError: a damaged source store.
    """
    t0 = time.perf_counter()
    block_symbols = check_block_symbols(block_symbols)
    plan = make_plan(sets, exprs, label, files, universe=universe)
    dev = _device(device)
    st = store if isinstance(store, Store) else open_store(store)
    universe_digest(st, universe)                      # an unknown universe: before any work
    if not isinstance(out, (str, os.PathLike)):
        raise InputError(f"out={out!r}: expected a store directory path")
    out = Path(out)
    safefs.outside_store(st.path, out)
    block_rows(st.n_dates, plan, block=block_symbols)        # refused here, before the target is touched
    instead = (f"`kline-store features {out} --update` brings it up to date, --replace (replace=True) "
               "recomputes it")
    with silenced(quiet), whole_store(out, wait=wait, replace=replace, instead=instead):
        m, missing = _write_full(out, st, plan, dev, block_symbols, None, mf.new_store_id(), threads)
        reclaim.collect_in_background(out, m)  # the replaced version's files: off the critical path
    return FeatureReport(out, "full", "", st.n_symbols, st.n_dates, plan.names, st.n_symbols * st.n_dates,
                         time.perf_counter() - t0, str(dev), missing, m["version"], _readers(plan, missing))


def _readers(plan: FeaturePlan, missing: list[str]) -> list[str]:
    """The plan's features that read one of the missing fields."""
    gone = set(missing)
    return [f.name for f in plan.fields if fields_of(f.node) & gone]


def _full_reason(m: dict, st: Store, plan: FeaturePlan) -> str:
    """Why an update cannot be a tail append ('' when it can): first, whether ``st`` is still the store this one
    was computed from, extended by tail appends only (identity.change)."""
    changed = identity.change(m[META_KEY].get("source"), st)
    if changed:
        return changed
    n_old, t_old = m["shape"]["n_symbols"], m["shape"]["n_dates"]
    if st.symbols[:n_old] != m["symbols"] or st.n_dates < t_old or \
            [str(d) for d in st.dates[:t_old]] != [str(d) for d in np.asarray(m["calendar"], dtype=st.dates.dtype)]:
        return "the source store's symbols or calendar no longer extend this store's"
    if plan.max_lookback is None:
        return "a feature reads the whole series (an expanding or exponential window)"
    crosses = any(crossing(f.node) for f in plan.fields)
    if crosses and st.n_symbols > n_old:
        return "new symbols join the past days' cross-sections (a cross-sectional operator)"
    if crosses and m[META_KEY]["source"].get("universe_digest") != universe_digest(st, plan.universe):
        return f"universe {plan.universe}'s spans changed"
    if st.n_dates > m["shape"]["date_capacity"]:
        return "the room reserved for appended days is used up"
    return ""


def update_features(out: str | os.PathLike, device: str = "cpu", *, wait: float = 0.0,
                    block_symbols: int | None = None, quiet: bool = True,
                    threads: int | None = None) -> FeatureReport:
    """Bring a features store up to date with its source store (recorded in its manifest).

    New days of stored symbols cost O(new bars x longest window); new symbols their whole history. The result
    equals a full recompute cell for cell.

    Raises:
        StoreError: ``out`` is not a features store, or its source store is gone or damaged.
    """
    t0 = time.perf_counter()
    block_symbols = check_block_symbols(block_symbols)
    dev = _device(device)
    if not isinstance(out, (str, os.PathLike)):
        raise InputError(f"out={out!r}: expected a store directory path")
    out = Path(out)
    with silenced(quiet), lock.WriterLock(out, wait=wait) as held:
        m = prepare(out)
        if m is None:
            raise StoreError(f"{out}: no readable store here (its manifest is missing or damaged)")
        plan = plan_from_manifest(m, out / mf.MANIFEST)
        if "processing" in m[META_KEY]:
            raise InputError(f"{out}: a processed store (its statistics were fitted once); update the features "
                             "store it came from, then process that again")
        src = m[META_KEY].get("source")
        if not isinstance(src, dict) or not isinstance(src.get("path"), str):
            raise StoreError(f"{out}/{mf.MANIFEST}: manifest key '{META_KEY}.source' does not name the source store")
        st = open_store(src["path"])
        reason = _full_reason(m, st, plan)
        if not reason and (st.n_dates, st.n_symbols) == (m["shape"]["n_dates"], m["shape"]["n_symbols"]):
            return FeatureReport(out, "none", "", st.n_symbols, st.n_dates, plan.names, 0,
                                 time.perf_counter() - t0, str(dev), version=m["version"])
        try:
            if reason:
                new, missing = _write_full(out, st, plan, dev, block_symbols, None, threads=threads)
                mode, bars = "full", st.n_symbols * st.n_dates
            else:
                new, missing, bars = _write_tail(out, m, st, plan, dev, block_symbols, threads)
                mode = "tail"
        except BaseException:
            clean_failed_write(out, held, first=False)
            raise
        clean_staging(out)
        reclaim.collect_in_background(out, new)
    return FeatureReport(out, mode, reason, st.n_symbols, st.n_dates, plan.names, bars, time.perf_counter() - t0,
                         str(dev), missing, new["version"], _readers(plan, missing))


def _write_tail(out: Path, m: dict, st: Store, plan: FeaturePlan, device: torch.device,
                block: int | None, threads: int | None = None) -> tuple[dict, list[str], int]:
    """New days of stored symbols and whole new symbols, written where no committed version looks."""
    index, missing = _sources(st, plan)
    n_old, t_old = m["shape"]["n_symbols"], m["shape"]["n_dates"]
    n_rows, t_new, nf = st.n_symbols, st.n_dates, len(plan.fields)
    d0 = max(0, t_old - plan.max_lookahead - (plan.max_lookback or 0))   # history the new cells need
    # (rows, first day read, first day written): the old rows' new days, then the new rows' whole history
    parts = [(r0, r1, start, u0) for r0, r1, start, u0 in ((0, n_old, d0, t_old), (n_old, n_rows, 0, 0))
             if r1 > r0 and u0 < t_new]
    per_part = [block_rows(t_new - start, plan, block=block) for _, _, start, _ in parts]  # refused here
    cross = cross_inputs(st, plan, index, device, block or block_rows(t_new - d0, plan), d0)
    bar = Progress(n_rows, "computing", unit="symbols")
    try:
        with TailAppend(out, m, n_rows, t_new, nf, crash="features:tail") as txn:
            for (r0, r1, start, u0), rows in zip(parts, per_part):
                for lo in range(r0, r1, rows):
                    sl = slice(lo, min(lo + rows, r1))
                    vals = evaluate_block(st, sl, start, plan, index, device, cross if r0 == 0 else None, threads)
                    for r0, cells in placed(vals, start, u0, t_new, plan):
                        txn.write(lo + r0, cells, u0)
                        bar.step(cells.shape[0])
    finally:
        bar.close()
    new = txn.commit(symbols=st.symbols, dates=st.dates, fields=plan.names, first_bar=st.first_bar,
                     last_bar=st.last_bar, n_bars=st.manifest["n_bars"], sources=[source_entry(st, "features_of")],
                     extra=_extra(st, plan, m.get(mf.STORE_ID_KEY)))
    bars = n_old * (t_new - t_old) + (n_rows - n_old) * t_new
    return new, missing, bars


__all__ = ["BLOCK_BYTES", "Cross", "FeatureReport", "block_rows", "compute_features", "cross_inputs",
           "evaluate_block", "place_cells", "placed", "spans", "universe_digest", "update_features"]
