"""Fast window sums for the moment-based operators: Sum, Mean, Count, Std, Var, Max, Min, Corr, Cov, Slope,
Rsquare, Resi.

Each statistic is assembled from window sums of per-bar tensors (NaN filled with 0, validity as 0/1), and a
window sum is `unfold(...).sum(-1)` over a view: every window summed afresh, no running sum that drifts, so
a window of zeros sums to exactly 0 (Qlib's SUMP-style 0/(0+1e-12) stays 0). Second moments are taken about a
per-symbol centre (the series' first valid value, so no later bar moves a value's rounding), which keeps the usual sum-of-squares cancellation far below float64's
resolution for prices and volumes; a window whose valid values are all equal gets variance exactly 0, as
pandas mostly gives it (it counts repeated values), so Qlib's std guards (|std| <= 2e-5) see the same zeros.
(pandas' running sums do leave a residue now and then: on real A-share bars, 14 of 204,295 WVMA5 cells are
five zeros whose pandas std is ~1e-3, which Qlib divides by 1e-12; the engine gives the exact 0.)
N = 0 (expanding): running sums from the block's start.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn.functional import pad

from .window import Span

_NAN = float("nan")


def wsum(z: Tensor, n: int) -> Tensor:
    """Sum of z over the n bars ending at each bar (bars before the block count as 0)."""
    if n >= z.shape[1]:
        return z.cumsum(1)  # expanding: a running sum from the block's start, no differences taken
    return pad(z, (n - 1, 0)).unfold(1, n, 1).sum(-1)


def wcount(v: Tensor, n: int) -> Tensor:
    """Window sum of 0/1 values: running-sum differences, exact for integers in float64."""
    c = pad(v.cumsum(1), (1, 0))
    return c[:, 1:] - pad(c, (n - 1, 0))[:, : v.shape[1]] if n < v.shape[1] else c[:, 1:]


def wmax(z: Tensor, n: int, largest: bool = True) -> Tensor:
    """Maximum (or minimum) of z over the n bars ending at each bar."""
    if n >= z.shape[1]:
        return (z.cummax(1) if largest else z.cummin(1)).values
    fill = float("-inf") if largest else float("inf")
    win = pad(z, (n - 1, 0), value=fill).unfold(1, n, 1)
    return win.amax(-1) if largest else win.amin(-1)


class Prepared:
    """A series readied for window sums: float64 values, validity, NaN -> 0, centred about its first valid value; each
    part computed on first use."""

    def __init__(self, x: Tensor, valid: Tensor | None = None):
        self.x = x.to(torch.float64)
        self.valid = ~torch.isnan(self.x) if valid is None else valid
        self.v = self.valid.to(torch.float64)
        self.raw = torch.where(self.valid, self.x, 0)

    def count(self, n: int) -> Tensor:
        return wcount(self.v, n)

    @cached_property
    def d(self) -> Tensor:
        # The row's first valid value: a centre that no later bar changes (a mean of the whole row would let
        # bars after t move the rounding of values at t).
        first = self.valid.to(torch.int8).argmax(1, keepdim=True)
        centre = torch.where(self.valid.any(1, keepdim=True), self.raw.gather(1, first), 0.0)
        return torch.where(self.valid, self.x - centre, 0)

    def extreme(self, n: int, largest: bool) -> Tensor:
        fill = float("-inf") if largest else float("inf")
        return wmax(torch.where(self.valid, self.x, fill), n, largest)

    def flat(self, n: int) -> Tensor:
        """Windows whose valid values are all equal."""
        return self.extreme(n, True) == self.extreme(n, False)


def _n(n: int, span: Span) -> int:
    return n if n > 0 else span.n_bars


def m_count(x: Tensor, n: int, span: Span) -> Tensor:
    return Prepared(x).count(_n(n, span))


def m_sum(x: Tensor, n: int, span: Span) -> Tensor:
    p, n = Prepared(x), _n(n, span)
    return torch.where(p.count(n) > 0, wsum(p.raw, n), _NAN)


def m_mean(x: Tensor, n: int, span: Span) -> Tensor:
    p, n = Prepared(x), _n(n, span)
    return wsum(p.raw, n) / p.count(n)


def _var(p: Prepared, n: int) -> Tensor:
    cnt, s1, s2 = p.count(n), wsum(p.d, n), wsum(p.d * p.d, n)
    var = ((s2 - s1 * s1 / cnt) / (cnt - 1)).clamp(min=0)
    var = torch.where(p.flat(n), 0.0, var)
    return torch.where(cnt >= 2, var, _NAN)


def m_var(x: Tensor, n: int, span: Span) -> Tensor:
    return _var(Prepared(x), _n(n, span))


def m_std(x: Tensor, n: int, span: Span) -> Tensor:
    return m_var(x, n, span).sqrt()


def m_max(x: Tensor, n: int, span: Span) -> Tensor:
    p, n = Prepared(x), _n(n, span)
    return torch.where(p.count(n) > 0, p.extreme(n, True), _NAN)


def m_min(x: Tensor, n: int, span: Span) -> Tensor:
    p, n = Prepared(x), _n(n, span)
    return torch.where(p.count(n) > 0, p.extreme(n, False), _NAN)


def _pair(a: Tensor, b: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """count, co-moment and the two second moments over the rows where both are valid."""
    a, b = torch.broadcast_tensors(a.to(torch.float64), b.to(torch.float64))
    both = ~(torch.isnan(a) | torch.isnan(b))
    pa, pb = Prepared(a, both), Prepared(b, both)
    cnt = pa.count(n)
    sa, sb = wsum(pa.d, n), wsum(pb.d, n)
    sab = wsum(pa.d * pb.d, n) - sa * sb / cnt
    saa = (wsum(pa.d * pa.d, n) - sa * sa / cnt).clamp(min=0)
    sbb = (wsum(pb.d * pb.d, n) - sb * sb / cnt).clamp(min=0)
    saa = torch.where(pa.flat(n), 0.0, saa)
    sbb = torch.where(pb.flat(n), 0.0, sbb)
    return cnt, sab, saa, sbb


def m_cov(a: Tensor, b: Tensor, n: int, span: Span) -> Tensor:
    cnt, sab, _saa, _sbb = _pair(a, b, _n(n, span))
    return torch.where(cnt >= 2, sab / (cnt - 1), _NAN)


def m_corr(a: Tensor, b: Tensor, n: int, span: Span) -> Tensor:
    """pandas' pairwise corr (NaN where a variance is 0), then Qlib's guard on each input's own rolling std."""
    n = _n(n, span)
    cnt, sab, saa, sbb = _pair(a, b, n)
    out = torch.where(cnt >= 2, sab / (saa * sbb).sqrt(), _NAN)
    out = torch.where((saa == 0) | (sbb == 0), _NAN, out)
    flat = (m_std(a, n, span) <= 2e-5) | (m_std(b, n, span) <= 2e-5)
    return torch.where(flat, _NAN, out)


class _Fit(NamedTuple):
    cnt: Tensor  # valid slots
    sxy: Tensor  # co-moment of position and value about the window's means
    sxx: Tensor
    syy: Tensor
    mean_x: Tensor  # in the window's 1..n coordinates
    mean_y: Tensor  # about the series' centre (Prepared.d)
    p: Prepared


def _fit(x: Tensor, n: int) -> _Fit:
    """Least squares of the window's valid values on x = 1..n (newest at n, NaN slots keep their place, as
    Qlib's rolling.pyx). Positions are summed as bar indices about the block's middle and re-centred per
    window: slope, r^2 and residual do not depend on where x starts."""
    p = Prepared(x)
    t = torch.arange(x.shape[1], device=x.device, dtype=torch.float64)
    pos = t - t.mean()
    cnt = p.count(n)
    sx = wsum(p.v * pos, n)
    sy = wsum(p.d, n)
    sxx = wsum(p.v * pos * pos, n) - sx * sx / cnt
    sxy = wsum(p.d * pos, n) - sx * sy / cnt
    syy = (wsum(p.d * p.d, n) - sy * sy / cnt).clamp(min=0)
    flat = p.flat(n)  # all valid values equal: exactly no co-variation (else rounding residue / 0 = inf)
    syy = torch.where(flat, 0.0, syy)
    sxy = torch.where(flat, 0.0, sxy)
    mean_x = sx / cnt - (pos[None, :] - n)  # the newest bar, pos[t], is x = n
    return _Fit(cnt, sxy, sxx, syy, mean_x, sy / cnt, p)


def m_slope(x: Tensor, n: int, span: Span) -> Tensor:
    f = _fit(x, _n(n, span))
    return torch.where(f.cnt >= 2, f.sxy / f.sxx, _NAN)


def m_resi(x: Tensor, n: int, span: Span) -> Tensor:
    """The newest row's residual y_n - (slope * n + intercept); NaN when the newest row is NaN."""
    n = _n(n, span)
    f = _fit(x, n)
    fitted = f.mean_y + f.sxy / f.sxx * (n - f.mean_x)
    out = torch.where(f.p.valid, f.p.d - fitted, _NAN)
    return torch.where(f.cnt >= 2, out, _NAN)


def m_rsquare(x: Tensor, n: int, span: Span) -> Tensor:
    """r^2 = sxy^2 / (sxx syy); for N > 0 Qlib blanks windows whose rolling std is within 2e-5 of 0."""
    f = _fit(x, _n(n, span))
    out = torch.where(f.cnt >= 2, f.sxy * f.sxy / (f.sxx * f.syy), _NAN)
    if n > 0:
        out = torch.where(m_std(x, n, span) <= 2e-5, _NAN, out)
    return out
