"""Where each symbol's series lives on the panel, and sliding windows over [symbols, bars] tensors.

Qlib keeps one series per instrument that starts at its first bar and ends at its last: outside that span
there are no rows at all, inside it a suspension is a NaN row. The engine keeps every intermediate NaN
outside the span, so NaN-skipping windows already see only the rows Qlib has; `Span.age` (bars since the
first one) tells the few operators that count rows (IdxMax positions, WMA weights, expanding EMA, Ref(x, 0))
how many rows the truncated window really holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

# Elements one window block may hold ([symbols, bars, N] float64, 32 MiB): an operator makes a few temporaries
# of this size, which keeps a whole-series window (N = 0, or N clamped to the block) inside the block budget.
_BLOCK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Span:
    """first/last: inclusive bar index of each symbol's span on this block (first may be < 0, last >= T)."""

    first: Tensor  # int64 [S]
    last: Tensor  # int64 [S]
    n_bars: int
    # Per-pass memo of what several operators derive from one operand (its window sums, extremes, fit):
    # id(operand) -> (operand, {key: value}); the operand is held so that its id cannot be reused.
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def present(self) -> Tensor:
        """[S, T] bool: the bar lies inside the symbol's span."""
        t = torch.arange(self.n_bars, device=self.first.device)
        return (t >= self.first[:, None]) & (t <= self.last[:, None])

    def age(self) -> Tensor:
        """Rows of the symbol's series before each bar: t - first, [S, T] int64 (negative before the span)."""
        t = torch.arange(self.n_bars, device=self.first.device)
        return t - self.first[:, None]

    def first_value(self, x: Tensor) -> Tensor:
        """x at each symbol's first bar, broadcast over the bars (NaN if the first bar is not on the block)."""
        idx = self.first.clamp(0, self.n_bars - 1)
        val = x.gather(1, idx[:, None])
        inside = (self.first >= 0) & (self.first < self.n_bars)
        return torch.where(inside[:, None], val, torch.full_like(val, float("nan"))).expand_as(x)


def shared(span: Span, x: Tensor, key: tuple, make: Callable[[], Any]) -> Any:
    """make(), computed once per operand x and key in this pass (STD20 and CORR20 of $close share its sums)."""
    _x, kept = span.memo.setdefault(id(x), (x, {}))
    if key not in kept:
        kept[key] = make()
    return kept[key]


def forget(span: Span, x: Tensor) -> None:
    """Drop what the memo keeps for x: evaluate calls it when no later node reads x."""
    span.memo.pop(id(x), None)


def mask(x: Tensor, span: Span) -> Tensor:
    """x with NaN outside each symbol's span (always a floating tensor)."""
    if not x.is_floating_point():
        x = x.to(torch.float32)
    return torch.where(span.present, x, torch.full_like(x, float("nan")))


def shift(x: Tensor, n: int) -> Tensor:
    """x[t - n] at t (pandas shift): NaN where that row is off the block."""
    if n == 0:
        return x
    out = torch.full_like(x, float("nan"))
    if abs(n) >= x.shape[1]:
        return out
    if n > 0:
        out[:, n:] = x[:, :-n]
    else:
        out[:, :n] = x[:, -n:]
    return out


def rolling(fn: Callable[..., Tensor], xs: Sequence[Tensor], n: int, span: Span,
            fill: float = float("nan")) -> Tensor:
    """fn over sliding windows: fn(windows, age) with windows [S, B, n] (oldest first, newest last, NaN before
    the block, or `fill`) for a block of B bars and age [S, B] (span.age of those bars); returns [S, T].

    Bars are processed in blocks so that the unfolded windows stay under _BLOCK_ELEMENTS; unfold is a view,
    fn's temporaries are what costs memory."""
    n_sym, n_bars = xs[0].shape
    padded = [torch.nn.functional.pad(x, (n - 1, 0), value=fill) for x in xs]
    age = span.age()
    step = max(1, _BLOCK_ELEMENTS // max(1, n_sym * n))
    outs = []
    for t0 in range(0, n_bars, step):
        t1 = min(n_bars, t0 + step)
        wins = [p[:, t0 : t1 + n - 1].unfold(1, n, 1) for p in padded]
        outs.append(fn(*wins, age[:, t0:t1]))
    return torch.cat(outs, dim=1)


def window_length(age: Tensor, n: int) -> Tensor:
    """Rows the truncated window holds at each bar: min(n, age + 1), at least 0."""
    return (age + 1).clamp(0, n)
