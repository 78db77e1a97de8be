"""Which symbols have which fields: the default inputs that keep every symbol, and the note when a field leaves
symbols without a window.

A store's fields are the union of its files' columns: ``amount`` is a field when any file had it, and NaN for the
symbols whose files did not. A window needs every input finite, so a default that included it would silently give
those symbols no window at all (issue 25: 683 windows, all of one symbol of eleven). So the default inputs are the
default fields every symbol (with a bar) has; one left out is named once. And whatever the fields, when a field
has no value over a symbol's days in range while the symbol has bars there, the symbols it leaves without a window
are counted and named once.

A symbol has a field when any of its bars has a finite value of it. Most symbols show it at their first bar (one
cell read per symbol); only the others are read, a row at a time, up to their first finite value (all of a row that
lacks the field).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..features.plan import field_roles
from .blocks import BlockIndex
from .spec import DEFAULT_FIELDS, FieldRoles, SamplePlan, SampleSpec

_ROW_DAYS = 1 << 18   # days of a row read at a time when a row is searched (a few MiB)
_NOTED: set[str] = set()


def has_fields(panel: np.ndarray, first: np.ndarray, last: np.ndarray, rows: np.ndarray, fields: Sequence[int],
               lo: int = 0, hi: int | None = None) -> np.ndarray:
    """``[len(rows), len(fields)]`` bool: row ``rows[i]`` has a finite value of ``fields[j]`` on a day in
    ``[lo, hi]`` (its bars' days there: ``first``/``last`` are each row's first and last bar, -1 when none)."""
    hi = panel.shape[1] - 1 if hi is None else hi
    fields = list(fields)
    out = np.zeros((len(rows), len(fields)), dtype=bool)
    if not len(rows) or not fields:
        return out
    a = np.maximum(first[rows], lo)
    b = np.minimum(last[rows], hi)
    live = (first[rows] >= 0) & (a <= b)
    idx = np.flatnonzero(live)
    probe = panel[rows[idx], a[idx]][:, fields]          # one cell per row: its first bar in range
    out[idx] = np.isfinite(probe)
    for i in idx[~out[idx].all(axis=1)]:                 # the rest: searched a piece at a time
        want = np.flatnonzero(~out[i])
        for d in range(int(a[i]), int(b[i]) + 1, _ROW_DAYS):
            piece = panel[int(rows[i]), d: min(int(b[i]) + 1, d + _ROW_DAYS)][:, [fields[j] for j in want]]
            out[i, want] |= np.isfinite(piece).any(axis=0)
            want = np.flatnonzero(~out[i])
            if not len(want):
                break
    return out


def note(key: str, text: str) -> None:
    """One warning per distinct note in a process (splits and cross-sections over one store say it once)."""
    if key in _NOTED:
        return
    _NOTED.add(key)
    warnings.warn(f"kline-store: {text}", RuntimeWarning, stacklevel=5)


def default_fields(store: Any, candidates: Sequence[str], rows: np.ndarray) -> list[str]:
    """Of ``candidates`` (the default fields the store has, in its order), those every symbol of ``rows`` with a
    bar has; each one left out is named once ("amount: 1 of 11 symbols; pass fields=[...] to use it")."""
    idx = [store.fields.index(f) for f in candidates]
    with_bars = rows[store.first_bar[rows] >= 0]
    have = has_fields(store.panel, store.first_bar, store.last_bar, with_bars, idx)
    counts = have.sum(axis=0)
    keep = [f for f, c in zip(candidates, counts) if c == len(with_bars)]
    for f, c in zip(candidates, counts):
        if c < len(with_bars):
            note(f"{store.path}/{store.version}/default/{f}/{len(with_bars)}",
                 f"{store.path}: {f}: {int(c)} of {len(with_bars)} symbols; left out of the default fields "
                 f"({', '.join(keep)}); pass fields=[...] to use it")
    return keep


def fields_without_windows(store: Any, plan: Any, names: Sequence[str], rows: np.ndarray, windowed: np.ndarray
                           ) -> None:
    """Name once each field that leaves symbols without a window: a symbol of ``rows`` with bars in the plan's range
    and no window (``windowed`` False) whose days in range hold no value of that field."""
    d0, d1 = max(0, plan.lo - plan.window + 1), min(plan.hi, store.n_dates - 1)
    first, last = store.first_bar, store.last_bar
    idle = rows[~windowed & (first[rows] >= 0) & (first[rows] <= d1) & (last[rows] >= d0)]
    if not len(idle):
        return
    fields = [store.fields.index(f) for f in names]
    have = has_fields(store.panel, first, last, idle, fields, d0, d1)
    with_bars = int(((first[rows] >= 0) & (first[rows] <= d1) & (last[rows] >= d0)).sum())
    lacking = {f: int(n) for f, n in zip(names, (~have).sum(axis=0)) if n}
    if len(lacking) == 1:
        (f, lack), = lacking.items()
        note(f"{store.path}/{store.version}/nowindow/{f}/{plan!r}",
             f"{store.path}: field {f!r} has no value in range for {lack} of the {with_bars} symbols with bars "
             f"there: they have no window; leave it out of fields= to keep them")
    elif lacking:   # one line for them all: a symbol out of a universe in a split lacks every field (158 of them)
        counts = set(lacking.values())
        how = f"{counts.pop()}" if len(counts) == 1 else f"up to {max(lacking.values())}"
        note(f"{store.path}/{store.version}/nowindow/{','.join(lacking)}/{plan!r}",
             f"{store.path}: {len(lacking)} fields ({_short(list(lacking))}) have no value in range for {how} of the "
             f"{with_bars} symbols with bars there: they have no window; leave them out of fields= to keep them")


def _short(names: list[str], keep: int = 4) -> str:
    shown = ", ".join(map(repr, names[:keep]))
    return shown if len(names) <= keep else f"{shown}, ..."


def with_default_fields(spec: SampleSpec, store: Any, rows: np.ndarray) -> SampleSpec:
    """``spec`` with its default inputs made explicit for a bar store (the default fields every symbol of ``rows``
    has), so that a pickled dataset and every split over the store read the same fields. A features store (its own
    default inputs) or given fields: ``spec`` as it is."""
    if spec.fields is not None or FieldRoles(*field_roles(store.manifest)).default_fields:
        return spec
    candidates = [f for f in store.fields if f in DEFAULT_FIELDS]
    if not candidates:
        return spec   # resolve() says none of them is in the store
    keep = default_fields(store, candidates, np.asarray(rows, dtype=np.int64))
    if not keep:
        raise InputError(f"{store.path}: none of the default fields ({', '.join(candidates)}) is present for every "
                         f"symbol; pass fields=[...]")
    return dataclasses.replace(spec, fields=tuple(keep))


def note_unwindowed(store: Any, plan: SamplePlan, index: Any, rows: np.ndarray) -> None:
    """Name once each input (or label) field that leaves symbols of ``rows`` with bars in range without a window
    (``index``: the dataset's full index of flat cells, sorted, or its block index)."""
    rows = np.asarray(rows, dtype=np.int64)
    if isinstance(index, BlockIndex):
        windowed = index.counts[rows].sum(axis=1) > 0
    else:
        # in the index's own dtype: int64 needles would make searchsorted copy an int32 index to int64
        edges = np.searchsorted(index, (np.stack([rows, rows + 1]) * store.n_dates).astype(index.dtype))
        windowed = edges[1] > edges[0]
    names = dict.fromkeys([*plan.names, *(store.fields[i] for i in (plan.close, plan.label_field) if i is not None)])
    fields_without_windows(store, plan, list(names), rows, windowed)


__all__ = ["default_fields", "fields_without_windows", "has_fields", "note", "note_unwindowed",
           "with_default_fields"]
