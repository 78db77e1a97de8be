"""Qlib's single-series rolling operators that need whole windows: Skew, Kurt, Quantile, Med, Mad, Rank,
IdxMax, IdxMin, WMA; and Ref, Delta. (Sum, Mean, Std, ... are window sums, in moments.py.)

pandas rolling(N, min_periods=1); N = 0 is expanding.

Every function takes x [S, T] (NaN outside the symbol's span, see window.py), the window N and the Span, and
returns float64 [S, T]: pandas computes rolling statistics in float64 whatever the input, so the engine does.
NaN rows are skipped and a window needs one valid row (min_periods=1), Skew 3 and Kurt 4 (pandas' own
minimums). Windows before the first bar are NaN padding, which for NaN-skipping statistics is exactly Qlib's
shorter window at the start of a series; IdxMax/IdxMin and WMA, which count rows, use the span's age.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import kernels
from .moments import oldest_first, wcount
from .window import Span, rolling, shift, window_length

_NAN = float("nan")


def _n(n: int, span: Span) -> int:
    return n if n > 0 else span.n_bars  # 0: expanding, i.e. a window as long as the block


def _f64(x: Tensor) -> Tensor:
    return x.to(torch.float64)


def _exact(x: Tensor) -> Tensor:
    """x as a float tensor holding exactly x's values: float32 kept (order statistics, comparisons and
    positions of float32 values are those of their float64 values, at half the bytes), others float64."""
    return x if x.dtype in (torch.float32, torch.float64) else _f64(x)


def _central_sums(x: Tensor, n: int, span: Span, power: int) -> Tensor:
    """[S, T, 3]: count, sum of d^2 and of d^3 (power 3), d^4 (4) or |d| (1) over each window's valid values,
    d = x - the window's mean; every sum adds the window's slots oldest first (moments.oldest_first), the
    order the compiled kernel keeps (a reduction's would depend on the CPU's vector width), and the powers are
    products (d2 * d, d2 * d2), which any engine rounds alike."""
    n = _n(n, span)
    x = _f64(x)
    kern = kernels.compiled_for(x)
    if kern is not None:
        return kernels.central_sums(kern, x, n, power)

    def f(w, _age):
        valid = ~torch.isnan(w)
        count = valid.sum(-1).to(w.dtype)
        mean = oldest_first(torch.where(valid, w, 0)) / count
        d = torch.where(valid, w - mean[..., None], 0)
        d2 = d * d
        p = d.abs() if power == 1 else (d2 * d if power == 3 else d2 * d2)
        return torch.stack((count, oldest_first(d2), oldest_first(p)), -1)
    return rolling(f, [x], n, span)


def r_skew(x: Tensor, n: int, span: Span) -> Tensor:
    sums = _central_sums(x, n, span, 3)
    count = sums[..., 0]
    b, c = sums[..., 1] / count, sums[..., 2] / count
    out = (count * (count - 1)).sqrt() * c / ((count - 2) * b.pow(1.5))
    return torch.where((count >= 3) & (b > 1e-14), out, _NAN)  # pandas: variance <= 1e-14 is NaN


def r_kurt(x: Tensor, n: int, span: Span) -> Tensor:
    sums = _central_sums(x, n, span, 4)
    count = sums[..., 0]
    b, dd = sums[..., 1] / count, sums[..., 2] / count
    k = (count * count - 1) * dd / (b * b) - 3 * (count - 1).square()
    out = k / ((count - 2) * (count - 3))
    return torch.where((count >= 4) & (b > 1e-14), out, _NAN)


def r_quantile(x: Tensor, n: int, span: Span, q: float) -> Tensor:
    """pandas' linear interpolation between the order statistics lo = floor(q (count - 1)) and lo + 1 of the
    valid values. Only the k smallest (q < 0.5) or largest values can hold them, k about q N + 2: topk on k
    instead of sorting whole windows."""
    n = _n(n, span)
    largest = q >= 0.5
    k = min(n, (math.ceil((1 - q) * (n - 1)) if largest else math.floor(q * (n - 1))) + 2)
    fill = float("-inf") if largest else float("inf")

    x = _exact(x)
    kern = kernels.compiled_for(x)
    if kern is not None:
        return kernels.quantile(kern, x, n, q)
    nan = torch.isnan(x)
    counts = wcount((~nan).to(torch.float64), n)
    key = torch.where(nan, fill, x)  # invalid rows sort past every valid one

    def f(w, w_count, _age):
        count = w_count[..., -1].long()  # the count at the window's own (newest) bar
        top = w.topk(k, -1, largest=largest, sorted=True).values
        pos = q * (count - 1).clamp(min=0).to(torch.float64)
        lo = pos.floor().long()
        hi = torch.minimum(lo + 1, (count - 1).clamp(min=0))
        if largest:  # rank r from the bottom is index count-1-r from the top
            lo, hi = (count - 1 - lo).clamp(min=0), (count - 1 - hi).clamp(min=0)
        v_lo = top.gather(-1, lo[..., None])[..., 0].to(torch.float64)
        v_hi = top.gather(-1, hi[..., None])[..., 0].to(torch.float64)
        frac = pos - pos.floor()
        out = torch.where(frac > 0, v_lo + (v_hi - v_lo) * frac, v_lo)
        return torch.where(count > 0, out, _NAN)
    return rolling(f, [key, counts], n, span, fill=fill)


def r_med(x: Tensor, n: int, span: Span) -> Tensor:
    return r_quantile(x, n, span, 0.5)


def r_mad(x: Tensor, n: int, span: Span) -> Tensor:
    """Qlib's mad: mean absolute deviation from the mean of the valid values."""
    sums = _central_sums(x, n, span, 1)
    return sums[..., 2] / sums[..., 0]


def r_rank(x: Tensor, n: int, span: Span) -> Tensor:
    """pandas rolling rank(pct=True): average rank of the newest value among the valid ones, / count.
    less + (equal + 1) / 2 = (count + sum(sign(newest - w))) / 2 + 1 / 2, with sign(NaN) = 0 so that NaN rows
    count neither as less nor as equal (the sign of a float difference is exact: it is 0 only for equals)."""
    n = _n(n, span)
    x = _exact(x)
    kern = kernels.compiled_for(x)
    if kern is not None:
        return kernels.rank(kern, x, n)
    count = wcount((~torch.isnan(x)).to(torch.float64), n)

    def f(w, _age):
        return torch.sign(w[..., -1:] - w).sum(-1)  # integers, exact in float32 up to 2**24
    out = ((count + rolling(f, [x], n, span).to(torch.float64)) / 2 + 0.5) / count
    return torch.where(torch.isnan(x), _NAN, out)


def _idx(x: Tensor, n: int, span: Span, largest: bool) -> Tensor:
    """Qlib: rolling.apply(lambda x: x.argmax() + 1, raw=True). numpy's argmax takes a NaN as the maximum
    (argmin: as the minimum) and the first of equal extremes; positions count from the oldest row of the
    window as Qlib's series has it, which near the first bar is shorter than N. Rows outside the span get
    the value that never wins. (A real +-inf in the data ties with NaN here, where numpy prefers the NaN.)"""
    n = _n(n, span)
    x = _exact(x)
    kern = kernels.compiled_for(x)
    if kern is not None:
        return kernels.arg_extreme(kern, x, span.first, span.last, n, largest)
    nan = torch.isnan(x)
    win, lose = (float("inf"), float("-inf")) if largest else (float("-inf"), float("inf"))
    key = torch.where(span.present, torch.where(nan, win, x), lose)

    def f(w, age):
        best = w.argmax(-1) if largest else w.argmin(-1)
        offset = n - window_length(age, n)  # window slots before the series' first row
        return (best - offset + 1).to(torch.float64)
    out = rolling(f, [key], n, span, fill=lose)
    return torch.where(wcount((~nan).to(torch.float64), n) > 0, out, _NAN)


def r_idxmax(x: Tensor, n: int, span: Span) -> Tensor:
    return _idx(x, n, span, True)


def r_idxmin(x: Tensor, n: int, span: Span) -> Tensor:
    return _idx(x, n, span, False)


def r_wma(x: Tensor, n: int, span: Span) -> Tensor:
    """Qlib's weighted_mean: w = 1..L / sum(1..L) over the L rows of the (truncated) window, NaN rows keep
    their weight slot, and the result is np.nanmean(w * x): divided by the count of valid rows. The weighted
    values are added oldest slot first (as the compiled kernel does)."""
    n = _n(n, span)
    kern = kernels.compiled_for(x)
    if kern is not None:
        return kernels.weighted_mean(kern, x, span.first, n)

    def f(w, age):
        length = window_length(age, n).to(torch.float64)
        j = torch.arange(n, device=w.device, dtype=torch.float64)
        weight = j - (n - length[..., None]) + 1  # 1 for the series' oldest row in the window
        valid = ~torch.isnan(w)
        num = oldest_first(torch.where(valid, w * weight, 0)) / (length * (length + 1) / 2)
        return num / valid.sum(-1)
    return rolling(f, [_f64(x)], n, span)


def ref(x: Tensor, n: int, span: Span) -> Tensor:
    """Ref(x, N): pandas shift(N) on the symbol's series (N < 0 looks ahead); N = 0 is the first value."""
    return span.first_value(x) if n == 0 else shift(x, n)


def delta(x: Tensor, n: int, span: Span) -> Tensor:
    """Delta(x, N) = x - shift(x, N); N = 0: x minus the series' first value."""
    return x - ref(x, n, span)
