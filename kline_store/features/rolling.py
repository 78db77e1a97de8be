"""Qlib's single-series rolling operators that need whole windows: Skew, Kurt, Quantile, Med, Mad, Rank,
IdxMax, IdxMin, WMA; and Ref, Delta. (Sum, Mean, Std, ... are window sums, in moments.py.)

pandas rolling(N, min_periods=1); N = 0 is expanding.

Every function takes x [S, T] (NaN outside the symbol's span, see window.py), the window N and the Span, and
returns float64 [S, T]: pandas computes rolling statistics in float64 whatever the input, so the engine does.
NaN rows are skipped and a window needs one valid row (min_periods=1); the exceptions are pandas' own:
Std/Var need 2, Skew 3, Kurt 4, Count gives 0 where nothing is valid. Windows before the first bar are NaN
padding, which for NaN-skipping statistics is exactly Qlib's shorter window at the start of a series.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .window import Span, rolling, shift, window_length

_NAN = float("nan")


def _n(n: int, span: Span) -> int:
    return n if n > 0 else span.n_bars  # 0: expanding, i.e. a window as long as the block


def _f64(x: Tensor) -> Tensor:
    return x.to(torch.float64)


def _moments(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """valid mask, count and mean of the valid values of windows w [S, B, N]."""
    valid = ~torch.isnan(w)
    count = valid.sum(-1).to(w.dtype)
    mean = torch.where(valid, w, 0).sum(-1) / count
    return valid, count, mean


def _central(w: Tensor, valid: Tensor, mean: Tensor) -> Tensor:
    return torch.where(valid, w - mean[..., None], 0)


def _apply(fn, x: Tensor, n: int, span: Span) -> Tensor:
    return rolling(fn, [_f64(x)], _n(n, span), span)


def r_skew(x: Tensor, n: int, span: Span) -> Tensor:
    def f(w, _age):
        valid, count, mean = _moments(w)
        d = _central(w, valid, mean)
        b, c = d.square().sum(-1) / count, d.pow(3).sum(-1) / count
        out = (count * (count - 1)).sqrt() * c / ((count - 2) * b.pow(1.5))
        return torch.where((count >= 3) & (b > 1e-14), out, _NAN)  # pandas: variance <= 1e-14 is NaN
    return _apply(f, x, n, span)


def r_kurt(x: Tensor, n: int, span: Span) -> Tensor:
    def f(w, _age):
        valid, count, mean = _moments(w)
        d = _central(w, valid, mean)
        b, dd = d.square().sum(-1) / count, d.pow(4).sum(-1) / count
        k = (count * count - 1) * dd / (b * b) - 3 * (count - 1).square()
        out = k / ((count - 2) * (count - 3))
        return torch.where((count >= 4) & (b > 1e-14), out, _NAN)
    return _apply(f, x, n, span)


def r_quantile(x: Tensor, n: int, span: Span, q: float) -> Tensor:
    """pandas' linear interpolation between the order statistics of the valid values."""
    def f(w, _age):
        valid = ~torch.isnan(w)
        count = valid.sum(-1)
        ordered = torch.where(valid, w, float("inf")).sort(-1).values
        pos = q * (count - 1).clamp(min=0).to(torch.float64)
        lo = pos.floor().long()
        hi = torch.minimum(lo + 1, (count - 1).clamp(min=0))
        v_lo = ordered.gather(-1, lo[..., None])[..., 0]
        v_hi = ordered.gather(-1, hi[..., None])[..., 0]
        frac = pos - lo
        out = torch.where(frac > 0, v_lo + (v_hi - v_lo) * frac, v_lo)
        return torch.where(count > 0, out, _NAN)
    return _apply(f, x, n, span)


def r_med(x: Tensor, n: int, span: Span) -> Tensor:
    return r_quantile(x, n, span, 0.5)


def r_mad(x: Tensor, n: int, span: Span) -> Tensor:
    """Qlib's mad: mean absolute deviation from the mean of the valid values."""
    def f(w, _age):
        valid, count, mean = _moments(w)
        return _central(w, valid, mean).abs().sum(-1) / count
    return _apply(f, x, n, span)


def r_rank(x: Tensor, n: int, span: Span) -> Tensor:
    """pandas rolling rank(pct=True): average rank of the newest value among the valid ones, / count."""
    def f(w, _age):
        valid = ~torch.isnan(w)
        newest = w[..., -1:]
        less = (valid & (w < newest)).sum(-1)
        equal = (valid & (w == newest)).sum(-1)
        out = (less + (equal + 1) / 2) / valid.sum(-1)
        return torch.where(torch.isnan(newest[..., 0]), _NAN, out)
    return _apply(f, x, n, span)


def _idx(x: Tensor, n: int, span: Span, largest: bool) -> Tensor:
    """Qlib: rolling.apply(lambda x: x.argmax() + 1, raw=True). numpy's argmax takes the first NaN as the
    maximum (argmin too), else the first extreme; positions count from the oldest row of the window as Qlib's
    series has it, which near the first bar is shorter than N."""
    n = _n(n, span)

    def f(w, age):
        j = torch.arange(n, device=w.device)
        offset = n - window_length(age, n)  # padding columns before the series' first row
        inside = j >= offset[..., None]
        isnan = torch.isnan(w) & inside
        first_nan = isnan.to(torch.uint8).argmax(-1)
        fill = float("-inf") if largest else float("inf")
        filled = torch.where(inside & ~isnan, w, fill)
        best = filled.argmax(-1) if largest else filled.argmin(-1)
        pos = torch.where(isnan.any(-1), first_nan, best) - offset + 1
        has_valid = (inside & ~torch.isnan(w)).any(-1)
        return torch.where(has_valid, pos.to(torch.float64), _NAN)
    return rolling(f, [_f64(x)], n, span)


def r_idxmax(x: Tensor, n: int, span: Span) -> Tensor:
    return _idx(x, n, span, True)


def r_idxmin(x: Tensor, n: int, span: Span) -> Tensor:
    return _idx(x, n, span, False)


def r_wma(x: Tensor, n: int, span: Span) -> Tensor:
    """Qlib's weighted_mean: w = 1..L / sum(1..L) over the L rows of the (truncated) window, NaN rows keep
    their weight slot, and the result is np.nanmean(w * x): divided by the count of valid rows."""
    n = _n(n, span)

    def f(w, age):
        length = window_length(age, n).to(torch.float64)
        j = torch.arange(n, device=w.device, dtype=torch.float64)
        weight = j - (n - length[..., None]) + 1  # 1 for the series' oldest row in the window
        valid = ~torch.isnan(w)
        num = torch.where(valid, w * weight, 0).sum(-1) / (length * (length + 1) / 2)
        return num / valid.sum(-1)
    return rolling(f, [_f64(x)], n, span)


def ref(x: Tensor, n: int, span: Span) -> Tensor:
    """Ref(x, N): pandas shift(N) on the symbol's series (N < 0 looks ahead); N = 0 is the first value."""
    return span.first_value(x) if n == 0 else shift(x, n)


def delta(x: Tensor, n: int, span: Span) -> Tensor:
    """Delta(x, N) = x - shift(x, N); N = 0: x minus the series' first value."""
    return x - ref(x, n, span)
