"""Qlib's EMA: pandas ewm(span=N) for integer N >= 1, ewm(alpha=N) for 0 < N < 1, and for N = 0 its own
expanding exp_weighted_mean.

pandas ewm (adjust=True, ignore_na=False, min_periods=1) gives, at a valid row t, the mean of the valid rows
i <= t weighted (1 - alpha)^(t - i), and at a NaN row repeats the last valid row's value. The weights are
applied as a window of K rows, K the age at which (1 - alpha)^K falls below 1e-17 (beyond float64's reach
in the sum), then NaN rows are forward-filled.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import kernels
from .moments import oldest_first
from .window import Span, rolling, window_length

_NAN = float("nan")


def _ffill(y: Tensor, valid: Tensor) -> Tensor:
    """y at the last valid row at or before each row; NaN before the first valid row."""
    t = torch.arange(y.shape[1], device=y.device)
    last = torch.where(valid, t, -1).cummax(1).values
    out = y.gather(1, last.clamp(min=0))
    return torch.where(last >= 0, out, _NAN)


def _ewm(x: Tensor, alpha: float, span: Span) -> Tensor:
    decay = 1.0 - alpha
    k = 1 if decay <= 0 else min(span.n_bars, max(1, math.ceil(math.log(1e-17) / math.log(decay))))
    j = torch.arange(k, device=x.device, dtype=torch.float64)
    weight = torch.tensor(decay, dtype=torch.float64, device=x.device) ** (k - 1 - j)   # oldest slot first
    kern = kernels.compiled_for(x)
    if kern is not None:
        return _ffill(kernels.weighted_window(kern, x, weight), ~torch.isnan(x))

    def f(w, _age):  # each window's sums add its slots oldest first, as the compiled kernel does
        valid = ~torch.isnan(w)
        return oldest_first(torch.where(valid, w * weight, 0)) / oldest_first(torch.where(valid, weight, 0))
    y = rolling(f, [x], k, span)
    return _ffill(y, ~torch.isnan(x))


def _expanding(x: Tensor, span: Span) -> Tensor:
    """exp_weighted_mean over the whole series so far: a = 1 - 2 / (1 + L), weights a^(L-1-i) normalised over
    all L rows (NaN rows included), then np.nansum: NaN rows pull the mean towards 0, as in Qlib."""
    n = span.n_bars

    def f(w, age):
        length = window_length(age, n).to(torch.float64)
        a = (1 - 2 / (1 + length))[..., None]
        j = torch.arange(n, device=w.device, dtype=torch.float64)
        inside = j >= (n - length[..., None])
        weight = torch.where(inside, a ** (n - 1 - j), 0)
        valid = ~torch.isnan(w) & inside
        out = torch.where(valid, w * weight, 0).sum(-1) / weight.sum(-1)
        return torch.where(valid.any(-1), out, _NAN)
    return rolling(f, [x], n, span)


def ema(x: Tensor, n: float, span: Span) -> Tensor:
    x = x.to(torch.float64)
    if n == 0:
        return _expanding(x, span)
    alpha = n if isinstance(n, float) and 0 < n < 1 else 2.0 / (n + 1)
    return _ewm(x, alpha, span)
