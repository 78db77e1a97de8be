"""Batch gather: the windows ending at ``(symbol, t)`` pairs, read from a panel in a few vectorised calls.

The panel is one flat float32 tensor (row ``s`` at ``s * row_stride``, day ``u`` of a row at ``u * n_fields``):
the store's memmap on the CPU, or a compact copy in pinned memory or on a GPU. It is viewed (``as_strided``)
as overlapping windows, one per cell, and a batch is picked with one ``index_select``: a copy that releases the
GIL, on any device. The label cells come with a second ``index_select``; then ``transforms.py`` adjusts, fills
and normalises the batch in place.

    (sym, t) --locate--> window starts, label cells --index_select--> x, scalar cells --transforms--> batch dict

A batch is a dict: ``x`` float32 ``[B, window, k]``, ``y`` float32 ``[B]``, ``symbol`` and ``t`` int64 ``[B]``
(plus ``observed`` bool ``[B, window]`` with ``missing="ffill"``). :meth:`Gatherer.sample` reads one sample
straight from the memmap, for ``dataset[i]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import transforms
from .spec import SamplePlan

Batch = dict[str, torch.Tensor]


def gather_windows(panel_t: torch.Tensor, row_stride: int, n_fields: int, sym: torch.Tensor, t: torch.Tensor,
                   window: int, out: torch.Tensor | None = None, fields: tuple[int, int] | None = None
                   ) -> torch.Tensor:
    """Windows ``panel[sym, t - window + 1 : t + 1, fields]`` of a flat panel, in one vectorised call.

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
    view = window_view(panel_t, n_fields, window, f0, k)
    start = sym * (row_stride // n_fields) + t - (window - 1)
    if out is None:
        return torch.index_select(view, 0, start)
    return torch.index_select(view, 0, start, out=out)


def window_view(panel_t: torch.Tensor, n_fields: int, window: int, f0: int, k: int) -> torch.Tensor:
    """``[n_starts, window, k]`` view of a flat panel: one overlapping window per start cell (no copy)."""
    n_cells = panel_t.numel() // n_fields
    return torch.as_strided(panel_t, (max(n_cells - window + 1, 0), window, k), (n_fields, n_fields, 1),
                            panel_t.storage_offset() + f0)


def sample_layout(plan: SamplePlan) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape (without the batch dimension) and dtype of each key of a batch, for preallocated buffers."""
    w, k = plan.window, len(plan.x_fields)
    layout: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "x": ((w, k), torch.float32), "y": ((), torch.float32), "symbol": ((), torch.int64),
        "t": ((), torch.int64)}
    if plan.missing == "ffill":
        layout["observed"] = ((w,), torch.bool)
    return layout


class Gatherer:
    """Batch gather over one placement of the panel.

    Args:
        plan: the sample plan (field indices relative to this panel's fields).
        panel_t: flat float32 panel tensor (memmap, pinned copy, or device copy).
        row_stride: elements between symbol rows of ``panel_t``.
        n_fields: fields per cell of ``panel_t``.
        t0: calendar index of the panel's day 0 (a compact copy starts at the first day samples use).
        bars: symbol-day mode only: every bar's flat cell index ``s * n_dates + u``, sorted, on the same device.
        stats: z-score ``(mean, std)`` tensors on the same device, for ``normalize="zscore"``.
    """

    def __init__(self, plan: SamplePlan, panel_t: torch.Tensor, row_stride: int, n_fields: int, t0: int = 0,
                 bars: torch.Tensor | None = None, stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        self.p = plan
        self.panel_t, self.row_stride, self.n_fields, self.t0 = panel_t, row_stride, n_fields, t0
        self.bars = bars
        self.bars_np = bars.numpy() if bars is not None and bars.device.type == "cpu" else None
        self.stats = stats
        self.device = panel_t.device
        self.panel_np = panel_t.numpy() if self.device.type == "cpu" else None
        self.x_sel = torch.tensor(plan.x_fields, dtype=torch.int64, device=self.device)
        self._views: dict[tuple[str, int, int], torch.Tensor] = {}
        # dataset[i] reads its window straight from the memmap when nothing but a slice and a label is needed
        self._direct = (self.panel_np is not None and plan.days == "calendar" and plan.adjust == "none"
                        and plan.missing == "drop" and plan.normalize in ("none", "zscore"))

    # -- views ------------------------------------------------------------------
    def _view(self, f0: int, k: int) -> torch.Tensor:
        key = ("w", f0, k)
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = window_view(self.panel_t, self.n_fields, self.p.window, f0, k)
        return v

    def _cell_view(self, f0: int, k: int) -> torch.Tensor:
        """``[n_cells, k]``: one row per (symbol, day) cell (symbol-day windows gather rows)."""
        key = ("c", f0, k)
        v = self._views.get(key)
        if v is None:
            nf = self.n_fields
            v = self._views[key] = torch.as_strided(self.panel_t, (self.panel_t.numel() // nf, k), (nf, 1),
                                                    self.panel_t.storage_offset() + f0)
        return v

    # -- index arithmetic ---------------------------------------------------------
    def _locate(self, sym: Any, t: Any) -> tuple[torch.Tensor | None, torch.Tensor | None, Any, int]:
        """Window starts (calendar days) or cell rows (symbol days), and the element indices of the scalar cells
        (close at t and at the label day, the label field, adj_factor at the label day), in that order.

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
        if p.label_kind == "field":
            want.append(label_cell + p.label_field)
        if p.adjust != "none":
            want.append(label_cell + p.adj)
        cells = np.concatenate(want) if on_np else torch.cat(want)
        if on_np:   # window starts and cell rows index tensors; the scalar cells stay numpy (read with numpy)
            return (None if start is None else torch.from_numpy(start),
                    None if rows is None else torch.from_numpy(rows), cells, len(want))
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

    # -- batch --------------------------------------------------------------------
    def gather(self, sym: np.ndarray | torch.Tensor, t: np.ndarray | torch.Tensor, out: Batch | None = None,
               normalize: bool = True) -> Batch:
        """The batch of windows ending at ``(sym, t)`` (calendar indices; int64 numpy arrays on the CPU, or
        tensors on the panel's device).

        Args:
            sym, t: the windows' symbol rows and last days.
            out: preallocated tensors (keys as the result, leading dimension >= B): filled and returned, sliced
                to B rows.
            normalize: apply the plan's normalisation (False for estimating z-score statistics).
        """
        p = self.p
        b = len(sym)
        x = torch.empty((b, p.window, len(p.x_fields)), device=self.device) if out is None else out["x"][:b]
        start, rows, cells, n_want = self._locate(sym, t)
        rng = p.x_range
        if rng is not None:  # one gather for a contiguous range of fields, else a wider range then a column pick
            self._gather_x(start, rows, rng[0], rng[1], x)
        else:
            lo, hi = min(p.x_fields), max(p.x_fields)
            torch.index_select(self._gather_x(start, rows, lo, hi - lo + 1, None), 2, self.x_sel - lo, out=x)
        on_cpu = isinstance(cells, np.ndarray)
        # Scalar cells: numpy reads 2-4 cells per window off the mapping for less than a torch op costs.
        vals = self.panel_np[cells].reshape(n_want, b) if on_cpu else \
            torch.index_select(self.panel_t, 0, cells).view(n_want, b)
        af_t = None
        if p.adjust != "none":
            assert p.adj is not None
            af_t = transforms.adjust_(x, self._gather_x(start, rows, p.adj, 1, None)[:, :, 0], p)
        obs = transforms.forward_fill_(x) if p.missing == "ffill" else None
        y = transforms.labels(vals, p, af_t)
        if normalize and p.normalize == "window":
            transforms.normalize_window_(x, torch.as_tensor(vals[0], device=self.device), af_t, p)
        elif normalize and p.normalize == "zscore":
            assert self.stats is not None
            transforms.zscore_(x, *self.stats)
        if out is None:
            res = {"x": x, "y": torch.as_tensor(y), "symbol": torch.as_tensor(sym), "t": torch.as_tensor(t)}
            if obs is not None:
                res["observed"] = obs
            return res
        # Buffers may be longer than this batch (a ring slot, the last chunk); CPU ones are filled by numpy.
        res = {"x": x}
        for k, v in (("y", y), ("symbol", sym), ("t", t), ("observed", obs)):
            if v is None:
                continue
            dst = out[k][:b]
            if on_cpu and not isinstance(v, torch.Tensor):
                dst.numpy()[...] = v
            else:
                dst.copy_(torch.as_tensor(v))
            res[k] = dst
        return res

    # -- one sample ---------------------------------------------------------------
    def sample(self, s: int, t: int) -> dict[str, Any]:
        """One sample: ``x`` ``[window, k]``, ``y`` (0-d), ``symbol`` and ``t`` as ints (plus ``observed``).

        With calendar days and no adjustment or filling, ``x`` is a copy of one slice of the memmap and the label
        two cells of it; other options run the batch path on a batch of one.
        """
        if not self._direct:
            b = self.gather(np.array([s], dtype=np.int64), np.array([t], dtype=np.int64))
            item: dict[str, Any] = {"x": b["x"][0], "y": b["y"][0], "symbol": int(s), "t": int(t)}
            if "observed" in b:
                item["observed"] = b["observed"][0]
            return item
        p, nf, a = self.p, self.n_fields, self.panel_np
        assert a is not None
        cell = s * self.row_stride + (t - self.t0) * nf
        rows = a[cell - (p.window - 1) * nf: cell + nf].reshape(p.window, nf)
        rng = p.x_range
        x = torch.from_numpy(rows[:, rng[0]: rng[0] + rng[1]].copy() if rng else rows[:, p.x_fields])
        if p.label_kind == "field":
            y = np.float32(a[cell + p.horizon * nf + p.label_field])
        else:
            c0, c1 = float(a[cell + p.close]), float(a[cell + p.horizon * nf + p.close])
            y = np.float32(np.log(c1 / c0) if p.label_kind == "log_return" else c1 / c0 - 1.0)
        if p.normalize == "zscore":
            assert self.stats is not None
            transforms.zscore_(x, *self.stats)
        return {"x": x, "y": torch.from_numpy(np.array(y)), "symbol": int(s), "t": int(t)}


def resident_gather(panel: np.ndarray, plan: SamplePlan, span: tuple[int, int], valid: np.ndarray,
                    bars: np.ndarray | None, stats: tuple[torch.Tensor, torch.Tensor] | None, device: torch.device,
                    pin: bool = False) -> Any:
    """Copy the days ``span`` and the fields samples use of ``panel`` to ``device`` once; returns
    ``gather(positions, out=None) -> batch`` running there (positions index ``valid``, the flat valid-window cells).

    With ``device`` the CPU and ``pin`` the copy is in pinned host memory.
    """
    d0, d1 = span
    keep, compact = plan.compact()
    # Only the days and fields samples use, laid out so that x's fields are contiguous.
    host = torch.from_numpy(np.ascontiguousarray(panel[:, d0:d1][:, :, keep]))
    if pin:
        host = host.pin_memory()
    panel_t = host.reshape(-1).to(device)
    bars_t = torch.from_numpy(bars.astype(np.int64)).to(device) if bars is not None else None
    g = Gatherer(compact, panel_t, (d1 - d0) * len(keep), len(keep), d0, bars_t, stats)
    valid_t = torch.from_numpy(valid).to(device)
    nd = panel.shape[1]

    def gather(indices: torch.Tensor | np.ndarray, out: Batch | None = None) -> Batch:
        if device.type == "cpu" and isinstance(indices, np.ndarray):
            # Host copies (pinned or RAM) take the memmap's numpy index arithmetic: torch's per-op dispatch holds
            # the GIL, which many gather threads then queue for.
            flat_np = valid[indices].astype(np.int64)
            return g.gather(flat_np // nd, flat_np % nd, out)
        idx = torch.as_tensor(indices, dtype=torch.int64).to(device, non_blocking=True)
        flat = valid_t[idx].long()
        return g.gather(flat // nd, flat % nd, out)

    return gather
