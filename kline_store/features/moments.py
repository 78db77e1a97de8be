"""Fast window sums for the moment-based operators: Sum, Mean, Count, Std, Var, Max, Min, Corr, Cov, Slope,
Rsquare, Resi.

Each statistic is assembled from window sums of per-bar tensors (NaN filled with 0, validity as 0/1), and a
window sum adds the window's own terms oldest first (`wsum`; the compiled kernel keeps that order, so both
engines give the same bits): every window summed afresh, no running sum that drifts, so
a window of zeros sums to exactly 0 (Qlib's SUMP-style 0/(0+1e-12) stays 0). Second moments (and the fit's
positions) are taken about a centre inside each window, its newest valid value (and its middle slot): a
window's sums then depend on its own values alone, never on where the block starts, so an update computed
from a later block start, or FeatureWindows' short blocks, equal a full computation bit for bit (``centred``).
That also keeps the usual sum-of-squares cancellation far below float64's resolution for prices and volumes;
a window whose valid values are all equal gets variance exactly 0, as
pandas mostly gives it (it counts repeated values), so Qlib's std guards (|std| <= 2e-5) see the same zeros.
(pandas' running sums do leave a residue now and then: on real A-share bars, 14 of 204,295 WVMA5 cells are
five zeros whose pandas std is ~1e-3, which Qlib divides by 1e-12; the engine gives the exact 0.)
N = 0 (expanding) or a window longer than the block: running sums from the block's start, about the series'
first valid value (only a full computation reads them: its block is the whole series).
"""

from __future__ import annotations

from functools import cached_property
from typing import Callable, NamedTuple

import torch
from torch import Tensor
from torch.nn.functional import pad

from . import kernels
from .window import Span, shared

_NAN = float("nan")


# Elements of one chunk of materialised [symbols, bars, n] centred windows (2 MiB of float64: a chunk is
# made and summed while it is in cache, measured faster than larger ones).
_CHUNK = 1 << 18


def running(n: int, n_bars: int) -> bool:
    """Whether the windows of N = n on a block of n_bars are running sums from the block's start: N = 0
    (expanding) or longer than the block. A window as long as the block is summed like any other, so that its
    rounding is what a longer block gives (FeatureWindows reads exactly window + lookback bars)."""
    return n == 0 or n > n_bars


def wsum(z: Tensor, n: int) -> Tensor:
    """Sum of z over the n bars ending at each bar (bars before the block count as 0); n = 0: expanding. The
    window's terms are added oldest first: an order any engine can keep (the compiled kernel gives the same
    bits; a reduction such as unfold().sum() would depend on the CPU's vector width)."""
    if running(n, z.shape[1]):
        return z.cumsum(1)  # expanding: a running sum from the block's start, no differences taken
    kern = kernels.compiled_for(z)
    if kern is not None:
        return kernels.window_sum(kern, z, n)
    n_bars = z.shape[1]
    padded = pad(z, (n - 1, 0))
    acc = padded[:, :n_bars].clone()
    for k in range(1, n):
        acc += padded[:, k : k + n_bars]
    return acc


def oldest_first(w: Tensor) -> Tensor:
    """Sum of windows w [..., n] over their slots, slot 0 (the oldest) first: the order the compiled kernels
    keep too (a reduction's order would depend on the CPU's vector width)."""
    acc = w[..., 0].clone()
    for k in range(1, w.shape[-1]):
        acc += w[..., k]
    return acc


def centred(n: int, series: list[Tensor], fn: Callable[..., Tensor]) -> Tensor:
    """fn over the windows of n bars of each series ([S, B, n] views, zeros before the block), a chunk of bars
    at a time so that the centred copies fn makes stay under _CHUNK elements; fn returns [S, B, k]."""
    n_sym, n_bars = series[0].shape
    step = max(1, _CHUNK // max(1, n_sym * n))
    outs = []
    for t0 in range(0, n_bars, step):
        t1 = min(n_bars, t0 + step)
        # zeros before the block: only the chunks that reach back past its start are padded (no whole copies)
        parts = [z[:, t0 - n + 1: t1] if t0 >= n - 1 else pad(z[:, :t1], (n - 1 - t0, 0)) for z in series]
        outs.append(fn(*[z.unfold(1, n, 1) for z in parts]))
    return torch.cat(outs, dim=1)


def wmax(z: Tensor, n: int, largest: bool = True) -> Tensor:
    """Maximum (or minimum) of z (no NaN) over the n bars ending at each bar. (A van Herk running-extreme
    version was measured slower: torch's cummax is several times slower than amax over an unfolded view.)"""
    kern = kernels.compiled_for(z)
    if kern is not None:
        return kernels.window_extreme(kern, z, n, largest)
    if n >= z.shape[1]:
        return (z.cummax(1) if largest else z.cummin(1)).values
    fill = float("-inf") if largest else float("inf")
    win = pad(z, (n - 1, 0), value=fill).unfold(1, n, 1)
    return win.amax(-1) if largest else win.amin(-1)


def wcount(v: Tensor, n: int) -> Tensor:
    """Window sum of 0/1 values: running-sum differences, exact for integers in float64."""
    kern = kernels.compiled_for(v)
    if kern is not None:
        return kernels.window_count(kern, v, n)
    c = pad(v.cumsum(1), (1, 0))
    return c[:, 1:] - pad(c, (n - 1, 0))[:, : v.shape[1]] if n < v.shape[1] else c[:, 1:]


class Prepared:
    """A series readied for window sums: float64 values, validity, NaN -> 0; each part computed on first use
    and kept, per window length N (0: expanding), for the other operators that read the same series in this
    pass (see ``prepared``)."""

    def __init__(self, x: Tensor, valid: Tensor | None = None):
        self.x = x.to(torch.float64)
        self.valid = ~torch.isnan(self.x) if valid is None else valid
        self.v = self.valid.to(torch.float64)
        self.raw = torch.where(self.valid, self.x, 0)
        self._kept: dict[tuple, Tensor] = {}

    def _keep(self, key: tuple, make) -> Tensor:
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    def running(self, n: int) -> bool:
        return running(n, self.x.shape[1])

    def count(self, n: int) -> Tensor:
        return self._keep(("count", n), lambda: wcount(self.v, n or self.x.shape[1]))

    def s_raw(self, n: int) -> Tensor:
        return self._keep(("raw", n), lambda: wsum(self.raw, n))

    def s1(self, n: int) -> Tensor:
        """Sum of the window's valid values about its centre (``centre``; running: the series' first value)."""
        return self._keep(("s1", n), lambda: wsum(self.d, n)) if self.running(n) else self.moments(n)[..., 0]

    def s2(self, n: int) -> Tensor:
        return self._keep(("s2", n), lambda: wsum(self.dd, n)) if self.running(n) else self.moments(n)[..., 1]

    def moments(self, n: int) -> Tensor:
        """[S, T, 2]: sums of the centred valid values of each window of n bars, and of their squares."""
        def f(raw, v, c):
            d = (raw - c[..., -1:]).mul_(v)   # one copy of the windows, squared in place
            s1 = oldest_first(d)
            return torch.stack((s1, oldest_first(d.mul_(d))), -1)

        def make() -> Tensor:
            kern = kernels.compiled_for(self.raw)
            if kern is not None:
                return kernels.centred_moments(kern, self.raw, self.v, self.centre, n)
            return centred(n, [self.raw, self.v, self.centre], f)
        return self._keep(("moments", n), make)

    @cached_property
    def centre(self) -> Tensor:
        """Each bar's newest valid value at or before it (0 before the first): the centre of the window ending
        there, inside that window whenever the window holds a valid value."""
        t = torch.arange(self.x.shape[1], device=self.x.device)
        last = torch.where(self.valid, t, -1).cummax(1).values
        return torch.where(last >= 0, self.raw.gather(1, last.clamp(min=0)), 0.0)

    def var(self, n: int) -> Tensor:
        return self._keep(("var", n), lambda: _var(self, n))

    @cached_property
    def d(self) -> Tensor:
        """Running sums' centre: the row's first valid value, which no later bar changes."""
        first = self.valid.to(torch.int8).argmax(1, keepdim=True)
        centre = torch.where(self.valid.any(1, keepdim=True), self.raw.gather(1, first), 0.0)
        return torch.where(self.valid, self.x - centre, 0)

    @cached_property
    def dd(self) -> Tensor:
        return self.d * self.d

    def extreme(self, n: int, largest: bool) -> Tensor:
        def make() -> Tensor:
            fill = float("-inf") if largest else float("inf")
            return wmax(torch.where(self.valid, self.x, fill), n or self.x.shape[1], largest)
        return self._keep(("extreme", n, largest), make)

    def flat(self, n: int) -> Tensor:
        """Windows whose valid values are all equal."""
        def make() -> Tensor:
            kern = kernels.compiled_for(self.x)
            if kern is not None:
                return kernels.flat_windows(kern, torch.where(self.valid, self.x, _NAN), n or self.x.shape[1])
            return self.extreme(n, True) == self.extreme(n, False)
        return self._keep(("flat", n), make)


def prepared(x: Tensor, span: Span) -> Prepared:
    """x's Prepared, one per operand in the span's pass: Mean, Std, Max, Corr, Slope ... of one series share
    its window sums and extremes."""
    return shared(span, x, ("prepared",), lambda: Prepared(x))


def m_count(x: Tensor, n: int, span: Span) -> Tensor:
    return prepared(x, span).count(n)


def m_sum(x: Tensor, n: int, span: Span) -> Tensor:
    p = prepared(x, span)
    return torch.where(p.count(n) > 0, p.s_raw(n), _NAN)


def m_mean(x: Tensor, n: int, span: Span) -> Tensor:
    p = prepared(x, span)
    return p.s_raw(n) / p.count(n)


def _var(p: Prepared, n: int) -> Tensor:
    cnt, s1, s2 = p.count(n), p.s1(n), p.s2(n)
    kern = kernels.compiled_for(cnt, s1, s2)
    if kern is not None:
        return kernels.var_tail(kern, cnt, s1, s2, p.flat(n))
    var = ((s2 - s1 * s1 / cnt) / (cnt - 1)).clamp(min=0)
    var = torch.where(p.flat(n), 0.0, var)
    return torch.where(cnt >= 2, var, _NAN)


def m_var(x: Tensor, n: int, span: Span) -> Tensor:
    return prepared(x, span).var(n)


def m_std(x: Tensor, n: int, span: Span) -> Tensor:
    return m_var(x, n, span).sqrt()


def m_max(x: Tensor, n: int, span: Span) -> Tensor:
    p = prepared(x, span)
    return torch.where(p.count(n) > 0, p.extreme(n, True), _NAN)


def m_min(x: Tensor, n: int, span: Span) -> Tensor:
    p = prepared(x, span)
    return torch.where(p.count(n) > 0, p.extreme(n, False), _NAN)


def _paired(a: Tensor, b: Tensor, span: Span) -> tuple[Prepared, Prepared]:
    """a and b prepared over the rows where both are valid (each its own Prepared when those are its rows);
    once per pair in a pass (CORR5 .. CORR60 share them)."""
    def make():
        x, y = torch.broadcast_tensors(a.to(torch.float64), b.to(torch.float64))
        both = ~(torch.isnan(x) | torch.isnan(y))
        pa = prepared(a, span) if a.shape == x.shape and torch.equal(prepared(a, span).valid, both) \
            else Prepared(x, both)
        pb = prepared(b, span) if b.shape == y.shape and torch.equal(prepared(b, span).valid, both) \
            else Prepared(y, both)
        return pa, pb, b  # b held: its id stays its own while the memo keeps this
    return shared(span, a, ("pair", id(b)), make)[:2]


def _co_moment(pa: Prepared, pb: Prepared, n: int) -> Tensor:
    """Sum over each window of the product of a's and b's values about their own window centres."""
    if pa.running(n):
        return wsum(pa.d * pb.d, n)

    kern = kernels.compiled_for(pa.raw, pb.raw)
    if kern is not None:
        return kernels.co_moment(kern, pa.raw, pb.raw, pa.v, pa.centre, pb.centre, n)

    def f(ra, rb, v, ca, cb):
        return oldest_first((ra - ca[..., -1:]).mul_(rb - cb[..., -1:]).mul_(v))[..., None]
    return centred(n, [pa.raw, pb.raw, pa.v, pa.centre, pb.centre], f)[..., 0]


def _pair(a: Tensor, b: Tensor, n: int, span: Span) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """count, co-moment and the two second moments over the rows where both are valid."""
    pa, pb = _paired(a, b, span)
    cnt = pa.count(n)
    sa, sb = pa.s1(n), pb.s1(n)
    sab = _co_moment(pa, pb, n) - sa * sb / cnt
    saa = (pa.s2(n) - sa * sa / cnt).clamp(min=0)
    sbb = (pb.s2(n) - sb * sb / cnt).clamp(min=0)
    saa = torch.where(pa.flat(n), 0.0, saa)
    sbb = torch.where(pb.flat(n), 0.0, sbb)
    return cnt, sab, saa, sbb


def _compiled_pair(a: Tensor, b: Tensor, n: int, span: Span, corr: bool) -> tuple[Tensor, Tensor] | None:
    """_pair's tail in one compiled pass (see compiled.pair_tail), when the compiled engine is on."""
    pa, pb = _paired(a, b, span)
    cnt = pa.count(n)
    kern = kernels.compiled_for(cnt)
    if kern is None:
        return None
    return kernels.pair_tail(kern, cnt, pa.s1(n), pb.s1(n), _co_moment(pa, pb, n), pa.s2(n), pb.s2(n),
                             pa.flat(n), pb.flat(n), corr)


def m_cov(a: Tensor, b: Tensor, n: int, span: Span) -> Tensor:
    fused = _compiled_pair(a, b, n, span, corr=False)
    if fused is not None:
        return fused[0]
    cnt, sab, _saa, _sbb = _pair(a, b, n, span)
    return torch.where(cnt >= 2, sab / (cnt - 1), _NAN)


def m_corr(a: Tensor, b: Tensor, n: int, span: Span) -> Tensor:
    """pandas' pairwise corr (NaN where a variance is 0), then Qlib's guard on each input's own rolling std."""
    fused = _compiled_pair(a, b, n, span, corr=True)
    if fused is not None:
        num, prod = fused
        out = num / prod.sqrt()  # num is NaN where the torch code below gives NaN before the std guard
    else:
        cnt, sab, saa, sbb = _pair(a, b, n, span)
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
    mean_y: Tensor  # about the window's centre
    newest: Tensor  # the newest bar's value about the window's centre (NaN where it is not valid)


def _fit(x: Tensor, n: int, span: Span) -> _Fit:
    """_fit_of(x, n), once for the Slope, Rsquare and Resi of one series and window."""
    return shared(span, x, ("fit", n), lambda: _fit_of(prepared(x, span), n))


def _position_sums(p: Prepared, n: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(sx, sxx, sxy, newest x) of each window: valid slots' positions, their squares and the centred values
    times the positions. Windows of n bars: positions are window slots about the middle (j - (n - 1) / 2), so
    a window's sums are its own; running windows: bar indices about the block's middle."""
    n_bars = p.x.shape[1]
    if p.running(n):
        t = torch.arange(n_bars, device=p.x.device, dtype=torch.float64)
        pos = t - t.mean()
        return wsum(p.v * pos, n), wsum(p.v * pos * pos, n), wsum(p.d * pos, n), pos[None, :]
    slot = torch.arange(n, device=p.x.device, dtype=torch.float64) - (n - 1) / 2

    def f(raw, v, c):
        vp = v * slot
        sx = oldest_first(vp)
        sxy = oldest_first((raw - c[..., -1:]).mul_(vp))
        return torch.stack((sx, oldest_first(vp.mul_(slot)), sxy), -1)
    kern = kernels.compiled_for(p.raw)
    sums = kernels.position_sums(kern, p.raw, p.v, p.centre, n) if kern is not None else \
        centred(n, [p.raw, p.v, p.centre], f)
    return sums[..., 0], sums[..., 1], sums[..., 2], torch.full((1, 1), (n - 1) / 2, dtype=torch.float64,
                                                                   device=p.x.device)


def _fit_of(p: Prepared, n: int) -> _Fit:
    """Least squares of the window's valid values on x = 1..n (newest at n, NaN slots keep their place, as
    Qlib's rolling.pyx), positions and values re-centred per window: slope, r^2 and residual do not depend on
    where x starts, nor on where the block does."""
    cnt = p.count(n)
    sx, sxx, sxy, newest_pos = _position_sums(p, n)
    sy = p.s1(n)
    sxx = sxx - sx * sx / cnt
    sxy = sxy - sx * sy / cnt
    syy = (p.s2(n) - sy * sy / cnt).clamp(min=0)
    flat = p.flat(n)  # all valid values equal: exactly no co-variation (else rounding residue / 0 = inf)
    syy = torch.where(flat, 0.0, syy)
    sxy = torch.where(flat, 0.0, sxy)
    w = n or p.x.shape[1]
    mean_x = sx / cnt - (newest_pos - w)  # the newest bar is x = w
    newest = torch.where(p.valid, p.d if p.running(n) else p.x - p.centre, _NAN)
    return _Fit(cnt, sxy, sxx, syy, mean_x, sy / cnt, newest)


def m_slope(x: Tensor, n: int, span: Span) -> Tensor:
    f = _fit(x, n, span)
    return torch.where(f.cnt >= 2, f.sxy / f.sxx, _NAN)


def m_resi(x: Tensor, n: int, span: Span) -> Tensor:
    """The newest row's residual y_n - (slope * n + intercept); NaN when the newest row is NaN."""
    f = _fit(x, n, span)
    fitted = f.mean_y + f.sxy / f.sxx * ((n or f.cnt.shape[1]) - f.mean_x)
    return torch.where(f.cnt >= 2, f.newest - fitted, _NAN)


def m_rsquare(x: Tensor, n: int, span: Span) -> Tensor:
    """r^2 = sxy^2 / (sxx syy); for N > 0 Qlib blanks windows whose rolling std is within 2e-5 of 0."""
    f = _fit(x, n, span)
    out = torch.where(f.cnt >= 2, f.sxy * f.sxy / (f.sxx * f.syy), _NAN)
    if n > 0:
        out = torch.where(m_std(x, n, span) <= 2e-5, _NAN, out)
    return out
