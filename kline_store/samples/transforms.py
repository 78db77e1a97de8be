"""What happens to gathered windows before a model sees them, as whole-batch tensor operations.

Each function works on a batch ``x`` of shape ``[B, window, k]`` on any device, in place where it can; none looks
past a window's last day ``t`` (the label is the one value taken later, by design):

* ``adjust_``: corporate-action adjustment by ``adj_factor`` (forward: relative to ``t``; backward: absolute);
* ``forward_fill_``: missing days take the last bar before them (leading ones the window's first bar);
* ``labels``: returns or log returns between ``t`` and the label day, in float64 before the cast;
* ``normalize_window_`` / ``zscore_``: per-window scaling, or train-split statistics.
"""

from __future__ import annotations

import numpy as np
import torch

from .spec import SamplePlan


def adjust_(x: torch.Tensor, af: torch.Tensor, plan: SamplePlan) -> torch.Tensor:
    """Multiply prices by the adjustment ratio and divide volume by it, in place.

    Args:
        x: ``[B, w, k]`` windows.
        af: ``[B, w]`` adj_factor of each window day.
        plan: field roles and the adjustment mode.

    Returns:
        ``af[:, -1]``, the factor at each window's last day (the label uses it).
    """
    af_t = af[:, -1]
    ratio = af / af_t[:, None] if plan.adjust == "forward" else af
    for c in plan.price_cols:
        x[:, :, c].mul_(ratio)
    for c in plan.volume_cols:
        x[:, :, c].div_(ratio)
    return af_t


def forward_fill_(x: torch.Tensor) -> torch.Tensor:
    """Fill days with a missing value from the last complete day before them, in place.

    Returns:
        ``observed``: bool ``[B, w]``, True where the day had every value.
    """
    obs = torch.isfinite(x).all(dim=2)
    # On a GPU the test would wait for the device on every batch; filling a complete batch changes nothing.
    if x.device.type != "cpu" or not bool(obs.all()):
        b, w = obs.shape
        ar = torch.arange(w, device=x.device).expand(b, -1)
        last = torch.where(obs, ar, torch.full_like(ar, -1)).cummax(dim=1).values
        first = obs.to(torch.int8).argmax(dim=1, keepdim=True)
        src = torch.where(last < 0, first, last)
        x.copy_(torch.gather(x, 1, src[:, :, None].expand(-1, -1, x.shape[2])))
    return obs


def labels(vals: np.ndarray | torch.Tensor, plan: SamplePlan, af_t: torch.Tensor | None) -> np.ndarray | torch.Tensor:
    """The label of each window.

    Args:
        vals: ``[n, B]`` scalar cells in the order ``gather.Gatherer`` fetches them: close at ``t`` and at the label
            day (when the plan has a close), the label field (for a field label), adj_factor at the label day
            (when adjusting). A numpy array on the CPU, a tensor on a device.
        plan: label kind and adjustment.
        af_t: adj_factor at each window's last day, when adjusting.

    Returns:
        float32 ``[B]`` (numpy for numpy cells). Returns are computed in float64: a float32 quotient minus 1 loses
        digits of small returns.
    """
    if plan.label_kind == "field":
        return vals[2 if plan.close is not None else 0]
    log = plan.label_kind == "log_return"
    if isinstance(vals, np.ndarray):
        v = vals.astype(np.float64)
        r = v[1] / v[0]
        if af_t is not None:
            r *= v[-1] / af_t.numpy()
        return (np.log(r) if log else r - 1.0).astype(np.float32)
    d = vals.double()
    r = d[1] / d[0]
    if af_t is not None:
        r = r * d[-1] / af_t.double()
    return (torch.log(r) if log else r - 1.0).float()


def normalize_window_(x: torch.Tensor, close_t: torch.Tensor, af_t: torch.Tensor | None,
                      plan: SamplePlan) -> None:
    """Prices divided by the window's last close (adjusted like the prices), volume-like fields by their window
    mean, in place."""
    denom = close_t * af_t if (af_t is not None and plan.adjust == "backward") else close_t
    for c in plan.price_cols:
        x[:, :, c].div_(denom[:, None])
    for c in plan.volume_like_cols:
        m = x[:, :, c].mean(dim=1, keepdim=True)
        x[:, :, c].div_(torch.where(m > 0, m, torch.ones_like(m)))


def zscore_(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> None:
    """``(x - mean) / std`` per field, in place."""
    x.sub_(mean).div_(std)
