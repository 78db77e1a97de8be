"""Qlib's Slope, Rsquare and Resi: least squares of the window's values on their positions (qlib/_libs).

rolling.pyx keeps a deque of N slots pre-filled with NaN, x = 1..N with the newest row at N, and skips NaN
slots without moving the others: a NaN row and a row before the series' first bar are the same thing here, so
NaN padding is exact. expanding.pyx numbers rows from the series' start; slope, R^2 and the newest row's
residual do not depend on where x starts, so the same formulas serve N = 0. Sums are taken fresh per window in
float64 where Qlib updates running sums: results agree to rounding, and where Qlib divides 0 by 0 plus a
rounding residue (one valid row) it may print inf where the engine gives NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .rolling import r_std
from .window import Span, rolling

_NAN = float("nan")


def _fit(w: Tensor) -> tuple[Tensor, ...]:
    """count, sums of x, x^2, y, y^2, xy over the valid slots of windows w [S, B, N], x = 1..N."""
    n = w.shape[-1]
    x = torch.arange(1, n + 1, device=w.device, dtype=torch.float64)
    valid = ~torch.isnan(w)
    y = torch.where(valid, w, 0)
    xv = torch.where(valid, x, 0)
    return (valid.sum(-1).to(torch.float64), xv.sum(-1), xv.square().sum(-1), y.sum(-1), y.square().sum(-1),
            (xv * y).sum(-1))


def _slope(cnt, sx, sxx, sy, sxy) -> Tensor:
    return (cnt * sxy - sx * sy) / (cnt * sxx - sx * sx)


def _run(fn, x: Tensor, n: int, span: Span) -> Tensor:
    return rolling(lambda w, _age: fn(w), [x.to(torch.float64)], n if n > 0 else span.n_bars, span)


def slope(x: Tensor, n: int, span: Span) -> Tensor:
    def f(w):
        cnt, sx, sxx, sy, _syy, sxy = _fit(w)
        return torch.where(cnt >= 2, _slope(cnt, sx, sxx, sy, sxy), _NAN)
    return _run(f, x, n, span)


def resi(x: Tensor, n: int, span: Span) -> Tensor:
    """The newest row's residual: y_N - (slope * N + intercept)."""
    def f(w):
        cnt, sx, sxx, sy, _syy, sxy = _fit(w)
        b = _slope(cnt, sx, sxx, sy, sxy)
        intercept = sy / cnt - b * sx / cnt
        out = w[..., -1] - (b * w.shape[-1] + intercept)
        return torch.where(cnt >= 2, out, _NAN)
    return _run(f, x, n, span)


def rsquare(x: Tensor, n: int, span: Span) -> Tensor:
    """r^2; for N > 0 Qlib also blanks windows whose pandas rolling std is within 2e-5 of 0."""
    def f(w):
        cnt, sx, sxx, sy, syy, sxy = _fit(w)
        r = (cnt * sxy - sx * sy) / ((cnt * sxx - sx * sx) * (cnt * syy - sy * sy)).sqrt()
        return torch.where(cnt >= 2, r * r, _NAN)
    out = _run(f, x, n, span)
    if n > 0:
        out = torch.where(r_std(x, n, span).abs() <= 2e-5, _NAN, out)
    return out
