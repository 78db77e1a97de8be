"""Qlib's processor pipelines on a features store, written as a new store that datasets read as they are.

Qlib's benchmarks normalise Alpha158 features with RobustZScoreNorm + Fillna (fitted on the train dates only)
and the label with DropnaLabel + CSRankNorm (per date, across symbols). ``process_features`` runs that pipeline
(``fit.Pipeline``: infer processors, then learn processors on their output, as DataHandlerLP's "append") over
the store's panel and writes the learn view: processed features, processed label, and NaN labels where a row was
dropped, so that datasets (which skip windows whose label is NaN) drop it too. The fitted state is recorded in
the manifest, each statistic from the rows of the fit dates alone.

A Qlib row is a (date, instrument) of the instrument's span, from its first bar to its last; the label, stored
``lookahead`` bars after the day it describes, is moved back to that day for the pipeline and forward again
when written. With ``universe=NAME`` the rows are also inside the universe's membership spans, as Qlib's
``DataHandlerLP(instruments=NAME, ...)`` loads them: fitted statistics come from member rows only, cross-sectional
processors rank or standardise over each day's members, and every row outside the universe is NaN in the output.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from ..memory import available
from ..progress import silenced
from ..store import NewVersion, collect, identity, manifest as mf, safefs, whole_store
from ..store.snapshot import Store, open_store
from .compute import source_entry, time_axis
from .fit import Pipeline, RobustZScoreNorm, ZScoreNorm
from .plan import META_KEY, field_lookahead, plan_from_manifest
from .processors import CSRankNorm, CSZScoreNorm, DropnaLabel, DropnaProcessor, Fillna, ProcessInf, Processor

# name -> (constructor given the column indices, the default group in infer / learn)
PROCESSORS = {
    "RobustZScoreNorm": lambda cols: RobustZScoreNorm(cols, clip_outlier=True),
    "ZScoreNorm": lambda cols: ZScoreNorm(cols),
    "CSZScoreNorm": lambda cols: CSZScoreNorm(cols),
    "CSRobustZScoreNorm": lambda cols: CSZScoreNorm(cols, method="robust"),
    "CSRankNorm": lambda cols: CSRankNorm(cols),
    "Fillna": lambda cols: Fillna(cols),
    "ProcessInf": lambda cols: ProcessInf(cols),
    "DropnaLabel": lambda cols: DropnaLabel(cols),
    "DropnaFeature": lambda cols: DropnaProcessor(cols),
}
QLIB_INFER = ("RobustZScoreNorm", "Fillna")            # Qlib's Alpha158 / Alpha360 benchmark configs
QLIB_LEARN = ("DropnaLabel", "CSRankNorm")


@dataclass
class ProcessReport:
    out: Path
    infer: list[str]
    learn: list[str]
    fit_dates: tuple[str, str]
    n_symbols: int
    n_dates: int
    dropped: int
    seconds: float
    universe: str | None = None

    def lines(self) -> list[str]:
        within = f" of universe {self.universe}" if self.universe else ""
        return [f"processed {self.out}: infer {' + '.join(self.infer) or '-'}, learn {' + '.join(self.learn) or '-'}"
                f"; fitted on {self.fit_dates[0]} .. {self.fit_dates[1]}; {self.n_symbols} symbols x {self.n_dates}"
                f" dates{within}; {self.dropped:,} rows dropped (label NaN); {self.seconds:.2f} s"]


def _processors(names, group: str, features: list[int], label: list[int], stage: str) -> list[Processor]:
    """``"Name"`` or ``"Name:feature|label|all"`` -> processors on those columns."""
    out = []
    for spec in names:
        if isinstance(spec, Processor):
            out.append(spec)
            continue
        name, _, which = str(spec).partition(":")
        which = which or ("label" if name == "DropnaLabel" else group)
        if name not in PROCESSORS:
            raise InputError(f"{stage} processor {name!r}: expected one of {', '.join(PROCESSORS)}")
        cols = {"feature": features, "label": label, "all": features + label}.get(which)
        if cols is None:
            raise InputError(f"{stage} processor {spec!r}: the group after ':' is feature, label or all")
        if not cols:
            raise InputError(f"{stage} processor {spec!r}: the store has no {which} column")
        out.append(PROCESSORS[name](cols))
    return out


def _day(text, st: Store, default: int, where: str) -> int:
    """Calendar index of the last date <= ``text`` (the first >= it for a start)."""
    if text is None:
        return default
    try:
        d = np.datetime64(str(text), "D")
    except ValueError:
        raise InputError(f"{where}={text!r}: not a date (YYYY-MM-DD)") from None
    days = st.dates.astype("datetime64[D]")
    return int(np.searchsorted(days, d, side="left")) if where == "fit_start" else \
        int(np.searchsorted(days, d, side="right")) - 1


def _needed_bytes(st: Store) -> int:
    return st.n_symbols * st.n_dates * st.n_fields * 4 * 5     # the panel, its copies and float64 columns


def process_features(store: str | os.PathLike, out: str | os.PathLike, infer=QLIB_INFER, learn=QLIB_LEARN, *,
                     fit_start=None, fit_end=None, universe: str | None = None, replace: bool = False,
                     wait: float = 0.0, quiet: bool = True) -> ProcessReport:
    """Run Qlib's processors over a features store and write the result as a new store at ``out``.

    Args:
        store: a features store (from compute_features).
        out: the processed store to write (same symbols, calendar, fields).
        infer: processors for features and label alike (Qlib's infer_processors): names, optionally with the
            column group, ``"RobustZScoreNorm"``, ``"CSZScoreNorm:label"``; default group: the features.
        learn: Qlib's learn_processors, run on the infer output; default group: the label.
        fit_start, fit_end: the dates the fitted statistics come from (Qlib's fit_start_time/fit_end_time); end
            is required when a fitted processor is used (no statistic from the valid or test dates).
        universe: a universe of the store (Qlib's ``instruments=``): the rows of its members on their member days
            only; every other row is NaN in the output.

    Raises:
        InputError: unknown processor, no fit_end for a fitted one, a store too big for memory.
    """
    t0 = time.perf_counter()
    st = open_store(store)
    plan = plan_from_manifest(st.manifest, st.path / mf.MANIFEST)
    names = st.fields
    label = [names.index(plan.label)] if plan.label else []
    features = [i for i in range(len(names)) if i not in label]
    procs_i = _processors(infer, "feature", features, label, "infer")
    procs_l = _processors(learn, "label", features, label, "learn")
    fitted = any(isinstance(p, (ZScoreNorm, RobustZScoreNorm)) for p in procs_i + procs_l)
    if fitted and fit_end is None:
        raise InputError("process_features: fit_end is required with a fitted processor (ZScoreNorm, "
                         "RobustZScoreNorm): its statistics must come from the train dates only")
    lo, hi = _day(fit_start, st, 0, "fit_start"), _day(fit_end, st, st.n_dates - 1, "fit_end")
    if hi < lo:
        raise InputError(f"fit_start={fit_start!r}, fit_end={fit_end!r}: no date of {st.path} in that range")
    free = available()
    if _needed_bytes(st) > 0.8 * free.nbytes:
        raise InputError(f"{st.path}: processing holds the panel in memory ({_needed_bytes(st) / 2**30:.1f} GiB "
                         f"needed, {free.nbytes / 2**30:.1f} GiB available by {free.source}); process a symbol "
                         "subset")
    out = Path(out)
    safefs.outside_store(st.path, out)
    within = st.membership(universe) if universe is not None else None    # an unknown name: before any work
    shifts = [field_lookahead(st.manifest, f) for f in names]
    x, present = _read_panel(st, shifts)
    member = torch.from_numpy(within.dense().T.copy()) if within is not None else None
    if member is not None:
        present &= member
    train = torch.zeros(st.n_dates, dtype=torch.bool)
    train[lo: hi + 1] = True
    pipe = Pipeline(infer=procs_i, learn=procs_l)
    states = pipe.fit(x, present, train)
    learn_view = pipe.apply(x, present, states).learn
    y = learn_view.x.clone()
    dropped = present & ~learn_view.present
    if label:
        y[..., label[0]] = torch.where(dropped, float("nan"), y[..., label[0]])
    if member is not None:
        y[~member] = float("nan")                     # Qlib has no row there
    panel = _to_store_layout(y, shifts)
    meta = dict(st.manifest[META_KEY])            # "source": the bar store the features came from
    meta["processed_from"] = identity.record(st)   # the features store itself, exactly
    meta["processing"] = {"infer": [str(p) if not isinstance(p, Processor) else type(p).__name__ for p in infer],
                          "learn": [str(p) if not isinstance(p, Processor) else type(p).__name__ for p in learn],
                          "fit_start": str(st.dates[lo]), "fit_end": str(st.dates[hi]), "universe": universe,
                          "states": {k: {n: _plain(v) for n, v in s.items()} for k, s in states.items()}}
    _write(st, out, panel, meta, replace, wait, quiet)
    return ProcessReport(out, [str(p) for p in infer], [str(p) for p in learn], (str(st.dates[lo]), str(st.dates[hi])),
                         st.n_symbols, st.n_dates, int(dropped.sum()), time.perf_counter() - t0, universe)


def _plain(v: torch.Tensor) -> list:
    """A state tensor as JSON: non-finite statistics (an all-NaN column) as null."""
    a = v.cpu().numpy()
    if a.dtype.kind == "f":
        return [float(x) if np.isfinite(x) else None for x in a.ravel().tolist()]
    return a.ravel().tolist()


def _read_panel(st: Store, shifts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[dates, symbols, fields] with each field at the day it describes; present: the symbols' spans."""
    x = np.full((st.n_dates, st.n_symbols, st.n_fields), np.nan, dtype=np.float32)
    groups = _by_shift(shifts)
    for s in range(st.n_symbols):                      # one row at a time: bounded temporaries
        row = np.asarray(st.panel[s])
        for a, cols in groups:
            x[: st.n_dates - a, s, cols] = row[a:, cols]
    t = np.arange(st.n_dates)[:, None]
    present = (st.first_bar[None, :] >= 0) & (t >= st.first_bar[None, :]) & (t <= st.last_bar[None, :])
    return torch.from_numpy(x), torch.from_numpy(present)


def _to_store_layout(y: torch.Tensor, shifts: list[int]) -> np.ndarray:
    """[dates, symbols, fields] back to [symbols, dates, fields], each field at the day it becomes known."""
    y = y.numpy()
    out = np.full((y.shape[1], y.shape[0], y.shape[2]), np.nan, dtype=np.float32)
    for a, cols in _by_shift(shifts):
        out[:, a:, cols] = y[: y.shape[0] - a, :, cols].transpose(1, 0, 2)
    return out


def _by_shift(shifts: list[int]) -> list[tuple[int, slice | list[int]]]:
    """The fields grouped by their shift (features 0, the label its lookahead): one copy per group, not per
    field (a field at a time strides through the whole panel)."""
    out = []
    for a in sorted(set(shifts)):
        cols = [f for f, b in enumerate(shifts) if b == a]
        run = cols == list(range(cols[0], cols[0] + len(cols)))
        out.append((a, slice(cols[0], cols[0] + len(cols)) if run else cols))
    return out


def _write(st: Store, out: Path, panel: np.ndarray, meta: dict, replace: bool, wait: float, quiet: bool) -> None:
    with silenced(quiet), whole_store(out, wait=wait, replace=replace,
                                      instead="pass replace=True (--replace) to rewrite it"):
        with NewVersion(out, *panel.shape, st.date_capacity, crash="process") as txn:
            txn.write_panel(panel)
            m = txn.commit(symbols=st.symbols, dates=st.dates, fields=st.fields, first_bar=st.first_bar,
                           last_bar=st.last_bar, n_bars=st.manifest["n_bars"], created_at=txn.created_at,
                           sources=[source_entry(st, "processed_from")],
                           extra={**time_axis(st), META_KEY: meta, mf.STORE_ID_KEY: mf.new_store_id()})
        collect(out, m)


__all__ = ["PROCESSORS", "ProcessReport", "QLIB_INFER", "QLIB_LEARN", "process_features"]
