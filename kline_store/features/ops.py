"""The operator table: Qlib's operator name -> a pure torch function over [symbols, bars] tensors.

Element-wise operators follow numpy's dtypes as Qlib meets them (a float32 field stays float32, so
`$high-$low+1e-12` keeps float32's rounding and 0/0 stays NaN as in Qlib); comparisons give 0/1 (numpy's
bools, as float32 so that NaN can mark rows outside the span); rolling operators compute in float64, as
pandas does. Operands may be Python numbers (constants of the expression).
"""

from __future__ import annotations

import operator
from typing import Callable, Union

import torch
from torch import Tensor

from . import infinity, moments, rolling, smooth
from .cross_section import KERNELS as CROSS_SECTIONAL
from .window import Span, mask

Value = Union[Tensor, float, int]


def _tensor_pair(a: Value, b: Value) -> tuple[Tensor, Tensor]:
    ref = a if isinstance(a, Tensor) else b
    as_t = lambda v: v if isinstance(v, Tensor) else torch.tensor(v, dtype=ref.dtype, device=ref.device)
    return as_t(a), as_t(b)


def _compare(fn: Callable) -> Callable[[Value, Value], Tensor]:
    return lambda a, b: fn(a, b).to(torch.float32)


def _truth(v: Value) -> Tensor | bool:
    return v != 0  # numpy truthiness: NaN is true


def _logical(fn: Callable) -> Callable[[Value, Value], Tensor]:
    def run(a: Value, b: Value) -> Tensor:
        ta, tb = _tensor_pair(_truth(a), _truth(b))
        return fn(ta, tb).to(torch.float32)
    return run


def _if(cond: Value, left: Value, right: Value) -> Tensor:
    if not isinstance(cond, Tensor):
        cond = torch.tensor(cond)
    return torch.where(_truth(cond), left, right)


def _float(x: Value) -> Value:
    return x.to(torch.float32) if isinstance(x, Tensor) and not x.is_floating_point() else x


def _sign(x: Tensor) -> Tensor:
    return torch.where(torch.isnan(x), x, torch.sign(x))  # torch.sign(NaN) is 0, numpy's is NaN


ELEMENTWISE: dict[str, Callable[..., Tensor]] = {
    "Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Div": operator.truediv,
    "Power": lambda a, b: torch.pow(a, b),
    "Greater": lambda a, b: torch.maximum(*_tensor_pair(a, b)),
    "Less": lambda a, b: torch.minimum(*_tensor_pair(a, b)),
    "Gt": _compare(operator.gt), "Ge": _compare(operator.ge), "Lt": _compare(operator.lt),
    "Le": _compare(operator.le), "Eq": _compare(operator.eq), "Ne": _compare(operator.ne),
    "And": _logical(torch.logical_and), "Or": _logical(torch.logical_or),
    "If": _if,
    "Abs": lambda x: torch.abs(_float(x)),
    "Log": lambda x: torch.log(_float(x)),
    "Sign": lambda x: _sign(x.to(torch.float32)),  # Qlib casts to float32 before np.sign
}

# fn(x, N, span) -> Tensor
WINDOWED: dict[str, Callable[[Tensor, int, Span], Tensor]] = {
    "Ref": rolling.ref, "Delta": rolling.delta, "Mean": moments.m_mean, "Sum": moments.m_sum,
    "Std": moments.m_std, "Var": moments.m_var, "Skew": rolling.r_skew, "Kurt": rolling.r_kurt,
    "Max": moments.m_max, "Min": moments.m_min, "IdxMax": rolling.r_idxmax, "IdxMin": rolling.r_idxmin,
    "Med": rolling.r_med, "Mad": rolling.r_mad, "Rank": rolling.r_rank, "Count": moments.m_count,
    "WMA": rolling.r_wma, "Slope": moments.m_slope, "Rsquare": moments.m_rsquare, "Resi": moments.m_resi,
    "EMA": smooth.ema,
}

# fn(a, b, N, span) -> Tensor
PAIRED: dict[str, Callable[[Tensor, Tensor, int, Span], Tensor]] = {"Corr": moments.m_corr, "Cov": moments.m_cov}


def clamp_window(op: str, params: tuple, n_bars: int) -> tuple:
    """params with a window N longer than the block cut to the block's length. The block holds the series from
    its start or the history its windows need (evaluate's contract), so a longer window holds nothing more:
    Mean($close, 200000) on 5,000 bars is Mean($close, 5000), computed in the memory of 5,000-bar windows.
    Ref and Delta are shifts (a shift past the block is all NaN already); EMA's own window is bounded."""
    if op in ("Ref", "Delta", "EMA") or not params or not isinstance(params[0], int):
        return params
    return (min(params[0], max(1, n_bars)), *params[1:])


def apply(op: str, args: list[Value], params: tuple, span: Span) -> Tensor:
    """One operator on already evaluated operands (tensors [S, T] or numbers)."""
    if op in ELEMENTWISE:
        return ELEMENTWISE[op](*args)
    params = clamp_window(op, params, span.n_bars)
    shape = (len(span.first), span.n_bars)
    given = [_float(a) if isinstance(a, Tensor) else
             mask(torch.full(shape, float(a), dtype=torch.float64, device=span.first.device), span) for a in args]
    if op in CROSS_SECTIONAL:  # over the symbols given (evaluate passes every symbol of a day); inf as pandas' rank
        return CROSS_SECTIONAL[op](*given)
    full = infinity.prepare(op, given, span)  # +-inf as Qlib's pandas reads them: infinity.py
    if op == "Quantile":
        return rolling.r_quantile(full[0], int(params[0]), span, float(params[1]))
    if op in PAIRED:
        return PAIRED[op](full[0], full[1], int(params[0]), span)
    n = params[0] if op == "EMA" else int(params[0])
    out = WINDOWED[op](full[0], n, span)
    return infinity.finish(op, given[0], n if n else span.n_bars, span, out)
