"""Qlib's Corr and Cov: pandas rolling(N, min_periods=1).corr/cov of two series, pairwise complete (a row
counts only where both are valid), ddof = 1 (N >= 1: Qlib has no expanding pair operator).
Qlib then blanks Corr wherever either input's own rolling std (not pairwise) is within 2e-5 of 0."""

from __future__ import annotations

import torch
from torch import Tensor

from .rolling import r_std
from .window import Span, rolling

_NAN = float("nan")


def _centered(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    valid = ~(torch.isnan(a) | torch.isnan(b))
    cnt = valid.sum(-1).to(torch.float64)
    da = torch.where(valid, a, 0)
    db = torch.where(valid, b, 0)
    da = torch.where(valid, da - (da.sum(-1) / cnt)[..., None], 0)
    db = torch.where(valid, db - (db.sum(-1) / cnt)[..., None], 0)
    return cnt, da, db


def _run(fn, a: Tensor, b: Tensor, n: int, span: Span) -> Tensor:
    a, b = torch.broadcast_tensors(a.to(torch.float64), b.to(torch.float64))
    return rolling(lambda wa, wb, _age: fn(wa, wb), [a, b], n if n > 0 else span.n_bars, span)


def cov(a: Tensor, b: Tensor, n: int, span: Span) -> Tensor:
    def f(wa, wb):
        cnt, da, db = _centered(wa, wb)
        return torch.where(cnt >= 2, (da * db).sum(-1) / (cnt - 1), _NAN)
    return _run(f, a, b, n, span)


def corr(a: Tensor, b: Tensor, n: int, span: Span) -> Tensor:
    def f(wa, wb):
        cnt, da, db = _centered(wa, wb)
        out = (da * db).sum(-1) / (da.square().sum(-1) * db.square().sum(-1)).sqrt()
        return torch.where(cnt >= 2, out, _NAN)
    out = _run(f, a, b, n, span)
    flat = (r_std(a, n, span).abs() <= 2e-5) | (r_std(b, n, span).abs() <= 2e-5)
    return torch.where(flat, _NAN, out)
