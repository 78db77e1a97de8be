"""KlineDataset and CrossSectionDataset: zero-copy windows over a store, labels, leakage-safe splits.

    store (memmap) --> windows.py (valid-window index, int64 per window) --> gather (torch, one index_select per
    batch over an as_strided view of overlapping windows) --> adjust --> fill --> normalise --> batch dict

A sample is the window of ``window`` days ending at day ``t`` of one symbol over the chosen fields, plus a label:

* ``x``: float32 ``[window, n_fields]``; ``y``: float32 scalar; ``symbol``: index into ``store.symbols``;
  ``t``: calendar index of the window's last day; with ``missing="ffill"`` also ``observed``: bool ``[window]``.
* label ``"return"`` (default): ``close[t + horizon] / close[t] - 1``; ``"log_return"``: its log; any store
  field name: that field's value at day ``t + horizon``. With ``adjust != "none"`` returns use adjusted closes
  (``close * adj_factor``), so a split between ``t`` and the label day is not a -86% return.
* default validity: a window is a sample when every cell of ``x`` is finite (so no suspension, pre-listing or
  post-delisting day inside it), ``t + horizon`` is inside the calendar, ``close[t + horizon]`` is finite and
  ``close[t] != 0`` (both > 0 for log returns; with adjustment, ``adj_factor`` finite and > 0 in every used
  cell). Options: ``missing="ffill"`` (only day ``t`` needs a bar; gaps are forward-filled inside the window
  and ``observed`` marks real bars) and ``days="symbol"`` (windows over the symbol's own trading days). The
  rules in full are in ``windows.py``.
* ``start``/``end``: ``t``'s date is at or after ``start`` and the label's date at or before ``end``: no label
  from outside the range, ever. ``make_splits`` builds train/valid/test with an embargo between them.
* normalisation, never looking ahead: none (raw), per window (prices / the window's last close, volume and amount
  / their window mean), or z-score with statistics from the train split only.

The panel is never copied into process memory: the dataset reads the store's memmap through a CPU tensor (a
second, copy-on-write mapping, so torch never sees a read-only buffer; nothing writes through it), and the index
costs 8 bytes per window. Datasets pickle as (path, version, parameters) and reopen the store lazily in each
process (fork and spawn workers). ``to_device`` (placement "pinned"/"device", used by ``device.py``) is the one
deliberate copy: the days the samples read, once, where the batches are gathered.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from . import windows as W
from .errors import InputError
from .store import Store, open_store

Adjust = Literal["none", "forward", "backward"]
Normalize = Literal["none", "window", "zscore"]
ADJUSTS = ("none", "forward", "backward")
NORMALIZES = ("none", "window", "zscore")
ADJ_FIELD = "adj_factor"
# Windows used to estimate z-score statistics (spread evenly over the index) and per gather call while doing so.
ZSCORE_SAMPLE = 65536
_STAT_CHUNK = 4096


# --------------------------------------------------------------------------- gather (torch, any device)


def gather_windows(panel_t: torch.Tensor, row_stride: int, n_fields: int, sym: torch.Tensor, t: torch.Tensor,
                   window: int, out: torch.Tensor | None = None, fields: tuple[int, int] | None = None
                   ) -> torch.Tensor:
    """Windows ``panel[sym, t - window + 1 : t + 1, fields]`` of a flat panel, in one vectorised call.

    The panel is viewed (``as_strided``) as overlapping windows, one per cell, and the wanted ones are picked with
    ``index_select``: a multithreaded copy that releases the GIL, on CPU (memmap or pinned) or CUDA alike.

    Args:
        panel_t: 1-D float32 tensor of the panel's elements, row ``s`` starting at ``s * row_stride``, day ``u``
            of a row at ``u * n_fields``.
        row_stride: elements between consecutive symbol rows (a multiple of ``n_fields``).
        n_fields: fields per cell.
        sym: int64 ``[B]`` symbol rows.
        t: int64 ``[B]`` last day of each window (relative to the panel's day 0), ``>= window - 1``.
        window: days per window.
        out: optional contiguous ``[B, window, k]`` tensor to fill.
        fields: ``(first, count)`` contiguous field range (default: all fields).

    Returns:
        ``[B, window, k]`` tensor (``out`` when given).
    """
    f0, k = fields if fields is not None else (0, n_fields)
    n_cells = panel_t.numel() // n_fields
    view = torch.as_strided(panel_t, (max(n_cells - window + 1, 0), window, k), (n_fields, n_fields, 1),
                            panel_t.storage_offset() + f0)
    start = sym * (row_stride // n_fields) + t - (window - 1)
    if out is None:
        return torch.index_select(view, 0, start)
    return torch.index_select(view, 0, start, out=out)


def _position(i: int, n: int, what: str) -> int:
    """Python-style index (negatives count from the end) checked against ``n`` items."""
    i = int(i)
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise IndexError(f"{what} {i} out of range [0, {n})")
    return j


def _alloc(shape: Sequence[int], dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
    """A fresh tensor; a whole batch inside a DataLoader worker goes directly into shared memory, so sending it
    costs no copy (single samples do not: a shared segment per sample costs more than the copy it saves)."""
    if (device is None or device.type == "cpu") and shape[0] > 1 \
            and torch.utils.data.get_worker_info() is not None:
        numel = math.prod(shape)
        storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
        return torch.empty(0, dtype=dtype).new(storage).resize_(*shape)
    return torch.empty(tuple(shape), dtype=dtype, device=device)


@dataclass
class _Plan:
    """Everything a gather needs besides the panel: field roles as column numbers of ``x``, options."""

    window: int
    horizon: int
    n_dates: int                    # calendar length (flat index = s * n_dates + t)
    x_fields: list[int]             # store field per x column
    x_range: tuple[int, int] | None  # (first, count) when x_fields is a contiguous ascending range
    close: int | None
    adj: int | None
    adjust: str
    label: str                      # "return", "log_return", "field"
    label_field: int | None
    price_cols: list[int]
    volume_cols: list[int]          # divided by the adjustment ratio
    volume_like_cols: list[int]     # divided by their window mean under per-window normalisation
    normalize: str
    missing: str
    days: str


class _Gatherer:
    """Batch gather over one placement of the panel (memmap CPU tensor, pinned copy, or device copy).

    ``t0`` is the calendar index of the panel tensor's day 0 (0 for the memmap, the first day used for a compact
    resident copy); ``bars`` (symbol-day mode) holds every bar's flat cell index, on the same device.
    """

    def __init__(self, plan: _Plan, panel_t: torch.Tensor, row_stride: int, n_fields: int, t0: int = 0,
                 bars: torch.Tensor | None = None, stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        self.p = plan
        self.panel_t, self.row_stride, self.n_fields, self.t0 = panel_t, row_stride, n_fields, t0
        self.bars = bars
        self.bars_np = bars.numpy() if bars is not None and bars.device.type == "cpu" else None
        self.stats = stats
        self.device = panel_t.device
        self.x_sel = torch.tensor(plan.x_fields, dtype=torch.int64, device=self.device)
        self._views: dict[tuple[str, int, int], torch.Tensor] = {}

    def _view(self, f0: int, k: int) -> torch.Tensor:
        """Cached ``as_strided`` view ``[n_starts, window, k]``: one overlapping window per start cell."""
        key = ("w", f0, k)
        v = self._views.get(key)
        if v is None:
            nf, w = self.n_fields, self.p.window
            n_cells = self.panel_t.numel() // nf
            v = torch.as_strided(self.panel_t, (max(n_cells - w + 1, 0), w, k), (nf, nf, 1),
                                 self.panel_t.storage_offset() + f0)
            self._views[key] = v
        return v

    def _cell_view(self, f0: int, k: int) -> torch.Tensor:
        """Cached view ``[n_cells, k]``: one row per (symbol, day) cell (symbol-day windows gather rows)."""
        key = ("c", f0, k)
        v = self._views.get(key)
        if v is None:
            nf = self.n_fields
            v = torch.as_strided(self.panel_t, (self.panel_t.numel() // nf, k), (nf, 1),
                                 self.panel_t.storage_offset() + f0)
            self._views[key] = v
        return v

    def _locate(self, sym: Any, t: Any) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, int]:
        """Index arithmetic of a batch: window starts (calendar) or cell rows (symbol-day), and the element
        indices of the scalar cells (close at t and at the label day, label field, adj_factor at the label day).

        Works on numpy arrays (CPU: a few cheap numpy ops, then zero-copy tensors) or on tensors (any device).
        """
        p, nf, w = self.p, self.n_fields, self.p.window
        on_np = isinstance(sym, np.ndarray)
        tl = t - self.t0 if self.t0 else t
        cell = sym * self.row_stride + tl * nf  # element offset of (s, t, field 0)
        start = rows = None
        if p.days == "symbol":
            nd = p.n_dates
            base = sym * nd
            if on_np:
                bars, j = self.bars_np, np.searchsorted(self.bars_np, base + t)
                span = np.arange(-(w - 1), 1)
            else:
                assert self.bars is not None
                bars, j = self.bars, torch.searchsorted(self.bars, base + t)
                span = torch.arange(-(w - 1), 1, device=self.device)
            days = bars[j[:, None] + span] - base[:, None]  # type: ignore[index]
            rows = (sym[:, None] * (self.row_stride // nf) + days - self.t0).reshape(-1)
            label_cell = cell + (bars[j + p.horizon] - base - t) * nf  # type: ignore[index]
        else:
            start = cell // nf - (w - 1)
            label_cell = cell + p.horizon * nf
        want = []
        if p.close is not None:
            want += [cell + p.close, label_cell + p.close]
        if p.label == "field":
            want.append(label_cell + p.label_field)
        if p.adjust != "none":
            want.append(label_cell + p.adj)
        cells = np.concatenate(want) if on_np else torch.cat(want)
        if on_np:
            return (None if start is None else torch.from_numpy(start),
                    None if rows is None else torch.from_numpy(rows), torch.from_numpy(cells), len(want))
        return start, rows, cells, len(want)

    def _gather_x(self, start: torch.Tensor | None, rows: torch.Tensor | None, f0: int, k: int,
                  out: torch.Tensor | None) -> torch.Tensor:
        """Windows of fields ``[f0, f0 + k)``: by start cell (calendar) or by cell rows (symbol-day)."""
        if rows is None:
            assert start is not None
            v = self._view(f0, k)
            return torch.index_select(v, 0, start) if out is None else torch.index_select(v, 0, start, out=out)
        b = len(rows) // self.p.window
        v = self._cell_view(f0, k)
        if out is None:
            return torch.index_select(v, 0, rows).view(b, self.p.window, k)
        torch.index_select(v, 0, rows, out=out.view(b * self.p.window, k))
        return out

    # -- batch ---------------------------------------------------------------
    def gather(self, sym: np.ndarray | torch.Tensor, t: np.ndarray | torch.Tensor,
               out: dict[str, torch.Tensor] | None = None, normalize: bool = True) -> dict[str, torch.Tensor]:
        """The batch of windows ending at ``(sym, t)`` (calendar indices; int64 numpy arrays on CPU, or tensors
        on the panel's device), as a dict of tensors.

        The common case (calendar days, contiguous fields, raw values) is one ``index_select`` for ``x`` and one
        for the label's cells; every step is a whole-batch operation.
        """
        p = self.p
        b, w = len(sym), p.window
        x = _alloc((b, w, len(p.x_fields)), torch.float32, self.device) if out is None else out["x"][:b]
        start, rows, cells, n_want = self._locate(sym, t)
        # 1. raw values: one gather when the fields are a contiguous range, else a wider range then a column pick
        if p.x_range is not None:
            self._gather_x(start, rows, p.x_range[0], p.x_range[1], x)
        else:
            lo, hi = min(p.x_fields), max(p.x_fields)
            wide = self._gather_x(start, rows, lo, hi - lo + 1, None)
            torch.index_select(wide, 2, self.x_sel - lo, out=x)
        # 2. scalar cells in one gather: close at t and at the label day, label field, adj_factor at the label day
        vals = torch.index_select(self.panel_t, 0, cells).view(n_want, b)
        adjusting = p.adjust != "none"
        # 3. adjustment relative to each window's last day (forward) or absolute (backward)
        af_t = None
        if adjusting:
            af = self._gather_x(start, rows, p.adj, 1, None)[:, :, 0]  # type: ignore[arg-type]
            af_t = af[:, -1]
            ratio = af / af_t[:, None] if p.adjust == "forward" else af
            for c in p.price_cols:
                x[:, :, c].mul_(ratio)
            for c in p.volume_cols:
                x[:, :, c].div_(ratio)
        # 4. missing days: forward fill inside the window (days before the window's first bar take that bar)
        obs = None
        if p.missing == "ffill":
            obs = torch.isfinite(x).all(dim=2)
            if not bool(obs.all()):
                ar = torch.arange(w, device=self.device).expand(b, -1)
                last = torch.where(obs, ar, torch.full_like(ar, -1)).cummax(dim=1).values
                first = obs.to(torch.int8).argmax(dim=1, keepdim=True)
                src = torch.where(last < 0, first, last)
                x.copy_(torch.gather(x, 1, src[:, :, None].expand(-1, -1, x.shape[2])))
        # 5. label, in float64 (a float32 quotient minus 1 loses digits of small returns); numpy on CPU, where it
        #    costs less per call than a chain of small tensor ops
        close_t = vals[0] if p.close is not None else None
        log = p.label == "log_return"
        if p.label == "field":
            y = vals[2 if p.close is not None else 0]
        elif vals.device.type == "cpu":
            v = vals.numpy().astype(np.float64)
            r = v[1] / v[0]
            if af_t is not None:
                r *= v[-1] / af_t.numpy()
            y = torch.from_numpy((np.log(r) if log else r - 1.0).astype(np.float32))
        else:
            v = vals.double()
            r = v[1] / v[0]
            if af_t is not None:
                r = r * v[-1] / af_t.double()
            y = (torch.log(r) if log else r - 1.0).float()
        # 6. normalisation, with no look-ahead: the window's own last close / mean, or train-split statistics
        if normalize and p.normalize == "window":
            assert close_t is not None
            denom = close_t * af_t if (af_t is not None and p.adjust == "backward") else close_t
            for c_ in p.price_cols:
                x[:, :, c_].div_(denom[:, None])
            for c_ in p.volume_like_cols:
                m = x[:, :, c_].mean(dim=1, keepdim=True)
                x[:, :, c_].div_(torch.where(m > 0, m, torch.ones_like(m)))
        elif normalize and p.normalize == "zscore":
            assert self.stats is not None
            mean, std = self.stats
            x.sub_(mean).div_(std)
        res = {"x": x, "y": y, "symbol": torch.as_tensor(sym), "t": torch.as_tensor(t)}
        if obs is not None:
            res["observed"] = obs
        if out is not None:  # preallocated buffers may be longer than this batch (a ring slot, the last batch)
            for k, v in res.items():
                if k != "x":
                    out[k][:b].copy_(v)
            return {k: out[k][:b] for k in res}
        return res


# --------------------------------------------------------------------------- dataset


def _field_indices(st: Store, fields: Sequence[str] | str | None, what: str = "fields") -> list[int]:
    if fields is None:
        names = [f for f in st.fields if f in W.DEFAULT_FIELDS]
        if not names:
            raise InputError(f"{st.path}: none of the default fields ({', '.join(W.DEFAULT_FIELDS)}) is in the "
                             f"store; pass fields= from {', '.join(st.fields)}")
    else:
        names = [fields] if isinstance(fields, str) else list(fields)
        if not names:
            raise InputError(f"{what}=[]: give at least one field; the store has {', '.join(st.fields)}")
    if len(set(names)) != len(names):
        raise InputError(f"{what}={names}: a field is listed twice")
    unknown = [f for f in names if f not in st.fields]
    if unknown:
        raise InputError(f"{st.path}: unknown field {', '.join(map(repr, unknown))}; the store has "
                         f"{', '.join(st.fields)}")
    return [st.fields.index(f) for f in names]


class KlineDataset(torch.utils.data.Dataset):
    """Windows of daily bars with a forward label, read zero-copy from a kline-store.

    Args:
        path: store directory (or an open :class:`~kline_store.store.Store`, whose snapshot is used).
        window: days per window.
        fields: input fields, in this order (default: those of open, high, low, close, volume, amount that the
            store has; never ``adj_factor`` unless asked for).
        horizon: label offset in days (the symbol's own bars with ``days="symbol"``).
        start: first date of ``t`` (None: no bound).
        end: last date of any label day (None: no bound).
        label: "return", "log_return", or a store field name (its value at ``t + horizon``).
        adjust: "none" (raw prices), "forward" (``price[u] * adj_factor[u] / adj_factor[t]``: relative to the
            window's last day, so no later corporate action leaks in; the last day equals raw) or "backward"
            (``price[u] * adj_factor[u]``); volume is divided by the same ratio. Needs an ``adj_factor`` field.
        normalize: "none" (raw values), "window" (prices / the window's last close, volume and amount / their
            window mean) or "zscore" (per field, statistics from ``stats``, else estimated from this dataset's
            own windows: build it on the train split and pass ``ds.stats`` to the others; ``make_splits`` does).
        stats: z-score statistics ``{"fields", "mean", "std"}`` (from another dataset's ``stats``).
        missing: "drop" (a window with a missing day is not a sample) or "ffill" (day ``t`` must have a bar; other
            missing days are forward-filled inside the window, leading ones take the window's first bar, and
            ``observed`` marks real bars).
        max_missing: with ``missing="ffill"``, the most missing days a window may have (None: any).
        days: "calendar" (windows of consecutive calendar days) or "symbol" (the symbol's own last ``window``
            bars; suspended days are skipped; label ``horizon`` bars later).
        version: store version to read (default: the current one, or the open Store's).

    Raises:
        InputError: unknown field, window longer than the calendar, no valid window in range, adjust without
            ``adj_factor``, bad option.
    """

    def __init__(self, path: str | os.PathLike | Store, window: int = 64, fields: Sequence[str] | None = None,
                 horizon: int = 1, start: W.DateLike = None, end: W.DateLike = None, *,
                 label: str = "return", adjust: Adjust = "none", normalize: Normalize = "none",
                 stats: dict[str, Any] | None = None, missing: Literal["drop", "ffill"] = "drop",
                 max_missing: int | None = None, days: Literal["calendar", "symbol"] = "calendar",
                 version: int | None = None) -> None:
        super().__init__()
        store = path if isinstance(path, Store) else None
        self.path = Path(store.path if store is not None else path)
        self.params: dict[str, Any] = {
            "window": int(window), "fields": ([fields] if isinstance(fields, str) else list(fields)) if fields is not None else None, "horizon": int(horizon),
            "start": start, "end": end, "label": label, "adjust": adjust, "normalize": normalize,
            "missing": missing, "max_missing": max_missing, "days": days}
        if store is not None:
            version = store.version if version is None else version
        self._store: Store | None = store if store is not None and version == store.version else None
        if self._store is None:
            self._store = open_store(self.path, version=version)
        self.version: int = self._store.version
        self._pid = os.getpid()
        self._setup()
        self._build_index()
        self.stats: dict[str, Any] | None = self._check_stats(stats) if stats is not None else None
        if normalize == "zscore" and self.stats is None:
            self.stats = self.estimate_stats()
            self._cpu = None  # rebuilt with the statistics

    # -- configuration ---------------------------------------------------------
    def _setup(self) -> None:
        """Validate parameters against the store and derive the gather plan (cheap; repeated in each process)."""
        st = self.store
        p = self.params
        window, horizon = p["window"], p["horizon"]
        for name, v, ok in (("adjust", p["adjust"], ADJUSTS), ("normalize", p["normalize"], NORMALIZES),
                            ("missing", p["missing"], W.MISSING), ("days", p["days"], W.DAYS)):
            if v not in ok:
                raise InputError(f"{name}={v!r}: expected one of {', '.join(map(repr, ok))}")
        if window < 1 or horizon < 1:
            raise InputError(f"window={window}, horizon={horizon}: both must be >= 1")
        if window + horizon > st.n_dates:
            raise InputError(f"window={window} plus horizon={horizon} is longer than the calendar of {st.path} "
                             f"({st.n_dates} days, {st.dates[0] if st.n_dates else '-'}.."
                             f"{st.dates[-1] if st.n_dates else '-'})")
        if p["days"] == "symbol" and p["missing"] == "ffill":
            raise InputError("days='symbol' windows have no missing days; use missing='drop' with them")
        if p["max_missing"] is not None and p["missing"] != "ffill":
            raise InputError("max_missing applies to missing='ffill' only")
        x_fields = _field_indices(st, p["fields"])
        self.fields: list[str] = [st.fields[i] for i in x_fields]
        label = p["label"]
        if label in W.LABELS:
            kind, label_field = label, None
        elif label in st.fields:
            kind, label_field = "field", st.fields.index(label)
            if p["adjust"] != "none" and (label in W.PRICE_FIELDS or label in W.VOLUME_FIELDS):
                raise InputError(f"label={label!r} with adjust={p['adjust']!r}: the label would be raw while x is "
                                 f"adjusted; use label='return' or 'log_return' (computed on adjusted closes)")
        else:
            raise InputError(f"label={label!r}: expected 'return', 'log_return' or a field of {st.path} "
                             f"({', '.join(st.fields)})")
        need_close = kind != "field" or p["normalize"] == "window"
        if need_close and "close" not in st.fields:
            raise InputError(f"{st.path}: no 'close' field, needed by label={label!r}/normalize="
                             f"{p['normalize']!r}; fields are {', '.join(st.fields)}")
        close = st.fields.index("close") if need_close else None
        adj = None
        if p["adjust"] != "none":
            if ADJ_FIELD not in st.fields:
                raise InputError(f"adjust={p['adjust']!r}: {st.path} has no {ADJ_FIELD!r} field (fields: "
                                 f"{', '.join(st.fields)}); ingest input with corporate-action data or use "
                                 f"adjust='none'")
            adj = st.fields.index(ADJ_FIELD)
        names = self.fields
        contiguous = x_fields == list(range(x_fields[0], x_fields[0] + len(x_fields)))
        self._plan = _Plan(
            window=window, horizon=horizon, n_dates=st.n_dates, x_fields=x_fields,
            x_range=(x_fields[0], len(x_fields)) if contiguous else None, close=close, adj=adj,
            adjust=p["adjust"], label=kind, label_field=label_field,
            price_cols=[i for i, f in enumerate(names) if f in W.PRICE_FIELDS],
            volume_cols=[i for i, f in enumerate(names) if f in W.VOLUME_FIELDS],
            volume_like_cols=[i for i, f in enumerate(names) if f in W.VOLUME_LIKE_FIELDS],
            normalize=p["normalize"], missing=p["missing"], days=p["days"])
        self.rule = W.WindowRule(
            window=window, horizon=horizon, x_fields=tuple(x_fields), close=close, label=kind,  # type: ignore
            label_field=label_field, adj=adj, adjust_label=adj is not None and kind != "field",
            missing=p["missing"], max_missing=p["max_missing"], days=p["days"])
        self.lo, self.hi = W.date_bounds(st.dates, p["start"], p["end"])
        self._cpu: _Gatherer | None = None

    def _build_index(self) -> None:
        st = self.store
        self._valid, self._bars = W.valid_index(st.panel, self.rule, self.lo, self.hi)
        if len(self._valid) == 0:
            raise InputError(self._explain_empty())

    def _explain_empty(self) -> str:
        st, p = self.store, self.params
        lo, hi = self.lo, self.hi
        span = (f"{st.dates[lo]}..{st.dates[hi]}" if 0 <= lo <= hi < st.n_dates else "an empty date range")
        msg = (f"{st.path}: no valid window in {span} (window={p['window']}, horizon={p['horizon']}, "
               f"fields={self.fields}, missing={p['missing']!r}, days={p['days']!r})")
        if hi - lo < p["horizon"]:  # t and its label day must both fit in the range
            return (msg + f": the range holds {max(0, hi - lo + 1)} trading days, a sample needs {p['horizon'] + 1}"
                    f" (t and its label day); widen start/end or shorten the horizon")
        panel = st.panel[:, max(0, lo - p["window"] + 1): hi + 1]
        share = {f: float(np.isfinite(panel[:, :, st.fields.index(f)]).mean()) for f in self.fields}
        worst = min(share, key=share.get)  # type: ignore[arg-type]
        return (msg + f": field {worst!r} is finite in only {share[worst]:.1%} of the cells; drop it from "
                f"fields=, use missing='ffill' or days='symbol', or a shorter window")

    @property
    def store(self) -> Store:
        """The open store snapshot (reopened lazily in a new process)."""
        if self._store is None:
            self._store = open_store(self.path, version=self.version, verify=False)
        return self._store

    # -- pickling: (path, version, parameters); the index and memmaps are rebuilt in the new process ----------
    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path), "version": self.version, "params": self.params, "stats": self.stats}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = Path(state["path"])
        self.version = state["version"]
        self.params = state["params"]
        self.stats = state["stats"]
        self._store = None
        self._pid = os.getpid()
        self._setup()
        self._valid = None  # type: ignore[assignment]
        self._bars = None

    def _index(self) -> np.ndarray:
        if self._valid is None:
            self._build_index()
        return self._valid

    # -- index ----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index())

    @property
    def window(self) -> int:
        return int(self.params["window"])

    @property
    def horizon(self) -> int:
        return int(self.params["horizon"])

    @property
    def symbols(self) -> list[str]:
        return self.store.symbols

    @property
    def dates(self) -> np.ndarray:
        return self.store.dates

    def valid_index(self) -> np.ndarray:
        """Flat cell index ``symbol * n_dates + t`` of every sample, sorted (int64, read-only)."""
        v = self._index().view()
        v.flags.writeable = False
        return v

    def locate(self, indices: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Sample positions -> ``(symbol, t)`` int64 arrays."""
        return W.decode(self._index()[np.asarray(indices, dtype=np.int64)], self.store.n_dates)

    def label_days(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        """Calendar index of each sample's label day."""
        flat = self._index()[np.asarray(indices, dtype=np.int64)]
        if self._bars is not None:
            return W.symbol_label_day(flat, self._bars, self.horizon) % self.store.n_dates
        return flat % self.store.n_dates + self.horizon

    def day_span(self) -> tuple[int, int]:
        """``(d0, d1)``: calendar days ``[d0, d1)`` any sample reads (window days and label days)."""
        v = self._index()
        nd = self.store.n_dates
        if self._bars is not None:
            j = np.searchsorted(self._bars, v)
            first = int((self._bars[j - (self.window - 1)] % nd).min())
        else:
            first = int((v % nd).min()) - (self.window - 1)
        last = int(self.label_days(np.arange(len(v))).max())
        return first, last + 1

    # -- gather ---------------------------------------------------------------
    def _cpu_gatherer(self) -> _Gatherer:
        if self._cpu is None or self._pid != os.getpid():
            st = self.store
            # Copy-on-write mapping of the generation file: torch gets a writable buffer (no warning) and nothing
            # can reach the file through it. Row s of the file is symbol s (DESIGN.md).
            size = st.n_symbols * st.row_stride
            mm = np.memmap(st.data_file, dtype=np.float32, mode="c", shape=(size,))
            panel_t = torch.from_numpy(mm)
            bars = torch.from_numpy(self._bars) if self._bars is not None else None
            self._cpu = _Gatherer(self._plan, panel_t, st.row_stride, st.n_fields, 0, bars, self._stats_t())
            self._pid = os.getpid()
        return self._cpu

    def _stats_t(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.stats is None:
            return None
        mean = torch.tensor(self.stats["mean"], dtype=torch.float32, device=device)
        std = torch.tensor(self.stats["std"], dtype=torch.float32, device=device)
        return mean, std

    def gather_flat(self, flat: np.ndarray, out: dict[str, torch.Tensor] | None = None
                    ) -> dict[str, torch.Tensor]:
        """Batch for flat cell indices (``symbol * n_dates + t``) of valid windows."""
        s, t = W.decode(flat, self.store.n_dates)
        g = self._cpu_gatherer()
        return g.gather(s, t, out)

    def gather_batch(self, indices: np.ndarray | Sequence[int] | torch.Tensor,
                     out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """A whole batch in one vectorised gather (the loader's path).

        Args:
            indices: sample positions ``0 <= i < len(self)``.
            out: optional preallocated tensors to fill (same keys as the result; leading dimension >= B, the
                first B rows are used and returned).

        Returns:
            dict: ``x`` float32 ``[B, window, n_fields]``, ``y`` float32 ``[B]``, ``symbol`` and ``t`` int64
            ``[B]`` (plus ``observed`` bool ``[B, window]`` with ``missing="ffill"``).
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        v = self._index()
        try:
            flat = v[idx]
        except IndexError:
            raise IndexError(f"sample index out of range [0, {len(v)})") from None
        if idx.size and idx.min() < 0:
            raise IndexError(f"sample index {int(idx.min())} is negative; positions are 0..{len(v) - 1}")
        return self.gather_flat(flat, out)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One sample (per-sample path, for a plain DataLoader): ``x``, ``y``, ``symbol`` (int), ``t`` (int)."""
        i = _position(i, len(self), "sample")
        b = self.gather_batch(np.array([i]))
        item: dict[str, Any] = {"x": b["x"][0], "y": b["y"][0], "symbol": int(b["symbol"][0]),
                                "t": int(b["t"][0])}
        if "observed" in b:
            item["observed"] = b["observed"][0]
        return item

    # -- statistics -------------------------------------------------------------
    def estimate_stats(self, max_windows: int = ZSCORE_SAMPLE) -> dict[str, Any]:
        """Per-field mean and std over (up to ``max_windows``, evenly spread) windows of this dataset.

        Values are taken as the model sees them before z-scoring (adjusted, filled); only observed cells count.
        """
        n = len(self)
        pos = np.unique(np.linspace(0, n - 1, min(n, max_windows)).astype(np.int64))
        k = len(self.fields)
        total = np.zeros(k)
        total_sq = np.zeros(k)
        count = np.zeros(k)
        g = self._cpu_gatherer()
        for a in range(0, len(pos), _STAT_CHUNK):
            s, t = self.locate(pos[a: a + _STAT_CHUNK])
            b = g.gather(s, t, normalize=False)
            x = b["x"].double()
            m = torch.isfinite(x)
            if "observed" in b:  # forward-filled cells are not data
                m &= b["observed"][:, :, None]
            x = torch.where(m, x, torch.zeros_like(x))
            total += x.sum(dim=(0, 1)).numpy()
            total_sq += (x * x).sum(dim=(0, 1)).numpy()
            count += m.sum(dim=(0, 1)).numpy()
        mean = total / np.maximum(count, 1)
        var = np.maximum(total_sq / np.maximum(count, 1) - mean * mean, 0.0)
        std = np.sqrt(var)
        std[~(std > 0)] = 1.0  # a constant field: centre it, do not blow it up
        return {"fields": list(self.fields), "mean": mean.tolist(), "std": std.tolist(),
                "windows": len(pos)}

    def _check_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        if list(stats.get("fields", [])) != self.fields or len(stats.get("mean", [])) != len(self.fields) \
                or len(stats.get("std", [])) != len(self.fields):
            raise InputError(f"stats are for fields {stats.get('fields')}, this dataset has {self.fields}; "
                             f"pass the train dataset's .stats built with the same fields")
        return dict(stats)

    # -- placement hooks (device.py) ---------------------------------------------
    def _resident_fields(self) -> tuple[list[int], _Plan]:
        """Store fields a resident copy keeps (x's fields first, in x order, then close/adj/label), and the
        gather plan renumbered for that compact copy: x becomes one contiguous range, the fast gather."""
        p = self._plan
        extra = [f for f in (p.close, p.adj, p.label_field) if f is not None and f not in p.x_fields]
        keep = list(p.x_fields) + list(dict.fromkeys(extra))
        at = {f: i for i, f in enumerate(keep)}
        k = len(p.x_fields)
        plan = dataclasses.replace(
            p, x_fields=list(range(k)), x_range=(0, k), close=at.get(p.close), adj=at.get(p.adj),
            label_field=at.get(p.label_field))
        return keep, plan

    def memmap_is_compact(self) -> bool:
        """True when x takes all of the store's fields in store order: the memmap already has the fast layout
        (each window one contiguous run), so a resident copy on the CPU would buy nothing."""
        return self._plan.x_fields == list(range(self.store.n_fields))

    def panel_nbytes(self) -> int:
        """Bytes of the panel a resident copy holds (the fields samples use, the days they read)."""
        d0, d1 = self.day_span()
        keep, _ = self._resident_fields()
        return self.store.n_symbols * (d1 - d0) * len(keep) * 4

    def to_device(self, device: torch.device | str, pin: bool = False
                  ) -> Callable[..., dict[str, torch.Tensor]]:
        """Copy the used part of the panel to ``device`` once; returns ``gather(indices) -> batch`` running there.

        ``indices`` are sample positions (int64 tensor, any device); the batch's tensors live on ``device``.
        With ``device="cpu"`` and ``pin=True`` the copy is in pinned host memory.
        """
        dev = torch.device(device)
        st = self.store
        d0, d1 = self.day_span()
        keep, plan = self._resident_fields()
        # Only the days and fields samples use, laid out so that x's fields are contiguous.
        host = torch.from_numpy(np.ascontiguousarray(st.panel[:, d0:d1][:, :, keep]))
        if pin:
            host = host.pin_memory()
        panel_t = host.reshape(-1).to(dev)
        bars = torch.from_numpy(self._bars).to(dev) if self._bars is not None else None
        g = _Gatherer(plan, panel_t, (d1 - d0) * len(keep), len(keep), d0, bars, self._stats_t(dev))
        valid = torch.from_numpy(self._index()).to(dev)
        nd = st.n_dates

        def gather(indices: torch.Tensor | np.ndarray, out: dict[str, torch.Tensor] | None = None
                   ) -> dict[str, torch.Tensor]:
            idx = torch.as_tensor(indices, dtype=torch.int64).to(dev, non_blocking=True)
            flat = valid[idx]
            return g.gather(flat // nd, flat % nd, out)

        return gather

    # -- loader -----------------------------------------------------------------
    def loader(self, batch_size: int = 256, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
               num_workers: int = 0, *, rank: int | None = None, world_size: int | None = None,
               tail: Literal["pad", "drop"] = "pad", device: Any = None, placement: str = "auto",
               config: Any = None, **dataloader_kwargs: Any) -> Any:
        """Batch loader: vectorised gathers, deterministic, resumable, sharded over DDP ranks.

        See :class:`kline_store.loader.KlineLoader`. With ``device``, ``config`` or an explicit ``placement``
        other than "memmap", the loader is handed to ``kline_store.device.wrap_loader`` (GPU feeding).
        """
        from .loader import KlineLoader, maybe_wrap

        ld = KlineLoader(self, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         num_workers=num_workers, rank=rank, world_size=world_size, tail=tail,
                         **dataloader_kwargs)
        return maybe_wrap(ld, self, device, placement, config)

    def __repr__(self) -> str:
        p = self.params
        return (f"KlineDataset({str(self.path)!r}, v{self.version}, {len(self)} windows, window={p['window']}, "
                f"horizon={p['horizon']}, fields={self.fields}, label={p['label']!r})")


# --------------------------------------------------------------------------- cross-sections


class CrossSectionDataset(torch.utils.data.Dataset):
    """One item per calendar day with at least ``min_count`` valid windows: all of that day's windows.

    Item: ``x`` ``[n, window, n_fields]``, ``y`` ``[n]``, ``symbol`` ``[n]`` int64, ``t`` int. Batches from
    :meth:`loader` stack days with padding: ``x`` ``[B, n_max, window, n_fields]``, ``y`` ``[B, n_max]`` (0 in
    padding), ``symbol`` ``[B, n_max]`` (-1 in padding), ``mask`` bool ``[B, n_max]``, ``t`` ``[B]``.

    Args: as :class:`KlineDataset` (``path``, ``window``, ``fields``, ``horizon``, ``start``, ``end`` and the
    keyword options), plus ``min_count``: fewest windows a day needs to be an item. ``path`` may also be a
    KlineDataset, whose windows are grouped (its own parameters apply; pass no others).
    """

    def __init__(self, path: str | os.PathLike | Store | KlineDataset, window: int = 64,
                 fields: Sequence[str] | None = None,
                 horizon: int = 1, start: W.DateLike = None, end: W.DateLike = None, *, min_count: int = 1,
                 **options: Any) -> None:
        super().__init__()
        if isinstance(path, KlineDataset):
            if options or fields is not None or start is not None or end is not None:
                raise InputError("CrossSectionDataset(KlineDataset, ...): the dataset's own parameters apply; "
                                 "pass a store path to set others")
            self.windows = path
        else:
            self.windows = KlineDataset(path, window, fields, horizon, start, end, **options)
        self.min_count = int(min_count)
        self._build()
        if len(self._days) == 0:
            raise InputError(f"{self.windows.path}: no day has {self.min_count} or more valid windows")

    def _build(self) -> None:
        st = self.windows.store
        days, offsets, order = W.by_day(self.windows._index(), st.n_symbols, st.n_dates)
        keep = np.diff(offsets) >= self.min_count
        if not keep.all():
            counts = np.diff(offsets)[keep]
            order = np.concatenate([order[a:b] for a, b in zip(offsets[:-1][keep], offsets[1:][keep])]) \
                if keep.any() else order[:0]
            offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
            days = days[keep]
        self._days, self._offsets, self._order = days, offsets, order

    def __getstate__(self) -> dict[str, Any]:
        return {"windows": self.windows, "min_count": self.min_count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.windows = state["windows"]
        self.min_count = state["min_count"]
        self._days = None  # type: ignore[assignment]

    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._days is None:
            self._build()
        return self._days, self._offsets, self._order

    def __len__(self) -> int:
        return len(self._tables()[0])

    @property
    def path(self) -> Path:
        return self.windows.path

    @property
    def store(self) -> Store:
        return self.windows.store

    @property
    def window(self) -> int:
        return self.windows.window

    @property
    def fields(self) -> list[str]:
        return self.windows.fields

    @property
    def days(self) -> np.ndarray:
        """Calendar index of each item's day."""
        return self._tables()[0]

    @property
    def stats(self) -> dict[str, Any] | None:
        return self.windows.stats

    def day_windows(self, i: int) -> np.ndarray:
        """Flat cell indices of day item ``i``'s windows (sorted by symbol)."""
        _, off, order = self._tables()
        return order[off[i]: off[i + 1]]

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = _position(i, len(self), "day")
        b = self.windows.gather_flat(self.day_windows(i))
        b["t"] = int(self._tables()[0][i])  # type: ignore[assignment]
        return b

    def gather_batch(self, indices: np.ndarray | Sequence[int] | torch.Tensor,
                     out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Days ``indices`` padded to the largest: one gather for all their windows (padding slots re-read the
        first window, then are cleared)."""
        days, off, order = self._tables()
        idx = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(days)):
            raise IndexError(f"day index out of range [0, {len(days)})")
        b = len(idx)
        counts = off[idx + 1] - off[idx]
        n_max = int(counts.max()) if b else 0
        slot = np.arange(n_max)[None, :]
        mask = slot < counts[:, None]
        src = np.where(mask, off[idx][:, None] + slot, off[idx][:, None])  # padding -> the day's first window
        flat = order[src.reshape(-1)]
        g = self.windows.gather_flat(flat)
        pad = torch.from_numpy(np.flatnonzero(~mask.reshape(-1)))
        res: dict[str, torch.Tensor] = {}
        for k, v in g.items():
            if k == "t":
                continue
            if len(pad):
                v.index_fill_(0, pad, -1 if k == "symbol" else 0)
            res[k] = v.view(b, n_max, *v.shape[1:])
        res["t"] = torch.from_numpy(days[idx].copy())
        res["mask"] = torch.from_numpy(mask)
        if out is not None:
            for k, v in res.items():
                out[k].copy_(v)
            return out
        return res

    def loader(self, batch_size: int = 1, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
               num_workers: int = 0, **kwargs: Any) -> Any:
        """Loader over days (padding plus mask); same options as :meth:`KlineDataset.loader`."""
        from .loader import KlineLoader, maybe_wrap

        device, placement, config = kwargs.pop("device", None), kwargs.pop("placement", "auto"), \
            kwargs.pop("config", None)
        ld = KlineLoader(self, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         num_workers=num_workers, **kwargs)
        return maybe_wrap(ld, self, device, placement, config)


# --------------------------------------------------------------------------- splits


class Splits(NamedTuple):
    """Datasets of consecutive, embargoed date ranges (``valid``/``test`` None when not asked for)."""

    train: Any
    valid: Any
    test: Any


def make_splits(path: str | os.PathLike | Store, train: tuple[W.DateLike, W.DateLike],
                valid: tuple[W.DateLike, W.DateLike] | None = None,
                test: tuple[W.DateLike, W.DateLike] | None = None, *, window: int = 64,
                fields: Sequence[str] | None = None, horizon: int = 1, embargo: int | None = None,
                cross_section: bool = False, **options: Any) -> Splits:
    """Train/valid/test datasets over consecutive date ranges, with an embargo between them.

    Each range is ``(start, end)``: ``t``'s date ``>= start`` and every label's date ``<= end``. The embargo is
    made by purging the end of the earlier split: its labels stop ``embargo`` trading days before the next
    split's first ``t`` (an ``end`` of None reaches exactly that far); a ``start`` of None begins ``embargo`` days
    after the previous split's end. Overlapping ranges are an error. Z-score statistics (``normalize="zscore"``)
    come from the train split only and are passed to the others.

    Args:
        path: store directory or open Store.
        train: ``(start, end)`` of the train split (None for an open end).
        valid: ``(start, end)`` or None.
        test: ``(start, end)`` or None.
        window: days per window.
        fields: input fields.
        horizon: label offset.
        embargo: trading days that must separate a split's last label day from the next split's first ``t``
            (default: ``horizon``; at least ``horizon`` is enforced).
        cross_section: build :class:`CrossSectionDataset` s instead of :class:`KlineDataset` s.
        **options: other dataset options (label, adjust, normalize, missing, days, ...).

    Returns:
        ``Splits(train, valid, test)``.

    Raises:
        InputError: overlapping ranges, a split left without days or valid windows.
    """
    embargo = horizon if embargo is None else int(embargo)
    if embargo < horizon:
        raise InputError(f"embargo={embargo} is shorter than horizon={horizon}: labels of one split would reach "
                         f"into the next")
    st = path if isinstance(path, Store) else open_store(path)
    bounds = W.split_bounds(st.dates, [train, valid, test], embargo, ["train", "valid", "test"])
    cls = CrossSectionDataset if cross_section else KlineDataset
    made: list[Any] = []
    stats = options.pop("stats", None)
    for b in bounds:
        if b is None:
            made.append(None)
            continue
        lo, hi = b
        if lo > hi or lo >= st.n_dates or hi < 0:
            raise InputError(f"split {['train', 'valid', 'test'][len(made)]} holds no trading day")
        ds = cls(st, window, fields, horizon, st.dates[lo], st.dates[hi], stats=stats, **options)
        if stats is None and options.get("normalize") == "zscore":
            stats = ds.stats  # train statistics for every later split
        made.append(ds)
    return Splits(*made)
