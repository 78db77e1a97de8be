"""+-inf as Qlib reads it: the one place that decides what a rolling operator does with an infinity.

Qlib's rolling and expanding operators run on pandas, and pandas turns +-inf into NaN before every window
aggregation (`BaseWindow._prep_values`: rolling, expanding and ewm alike, `.apply` included). So on a series
with zero volumes, Mean(Log($volume), 5) is the mean of the finite logs, not -inf. Measured operator by
operator against Qlib 0.9.7 (tests/features/test_infinity.py):

* missing (NaN) inside the window: Mean, Sum, Std, Var, Skew, Kurt, Max, Min, IdxMax, IdxMin, Quantile, Med,
  Mad, Rank, WMA, EMA (every form), Corr, Cov, and the std guards of Corr and Rsquare;
* kept: Count (pandas counts an infinity as a value), Ref and Delta (shifts), every element-wise operator
  (numpy keeps them: Log(0) is -inf, $close/0 is inf);
* Slope, Rsquare and Resi run on Qlib's own Cython running sums, which an infinity turns into NaN: NaN in every
  window that holds one. (Qlib's sums stay NaN after the infinity leaves the window, up to the end of what
  it loaded, so its value there depends on the query's start date; the engine gives the window's own value,
  which is what Qlib gives for a query starting at that day, and what lets `--update` equal a full compute.)

`as_missing` is applied to every operand of the first two groups before the operator runs; compiled kernels
must apply it too (or take its output) to stay cell-for-cell equal.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .moments import wcount
from .window import Span, shared

# Rolling operators whose pandas code sees +-inf as NaN (see the module's text).
INF_AS_MISSING = frozenset({"Mean", "Sum", "Std", "Var", "Skew", "Kurt", "Max", "Min", "IdxMax", "IdxMin", "Quantile",
                            "Med", "Mad", "Rank", "WMA", "EMA", "Corr", "Cov", "Slope", "Rsquare", "Resi"})
# ... of which these are NaN wherever the window holds an infinity (Qlib's running sums).
NAN_WHERE_WINDOW_HOLDS_INF = frozenset({"Slope", "Rsquare", "Resi"})

_FINITE = ("inf-as-missing",)


def as_missing(x: Tensor, span: Span) -> Tensor:
    """x with +-inf as NaN; x itself when it holds no infinity. Once per operand and pass, so that every
    operator reading x shares one tensor (and the window sums the pass keeps for it)."""
    def make() -> Tensor:
        inf = torch.isinf(x)
        return torch.where(inf, torch.full_like(x, float("nan")), x) if bool(inf.any()) else x
    return shared(span, x, _FINITE, make)


def window_holds_inf(x: Tensor, n: int, span: Span) -> Tensor:
    """[S, T] bool: the n bars ending at each bar hold a +-inf of x (n >= the block: any bar so far)."""
    return shared(span, x, ("holds-inf", n), lambda: wcount(torch.isinf(x).to(torch.float64), n) > 0)


def prepare(op: str, operands: list[Tensor], span: Span) -> list[Tensor]:
    """The operands as Qlib's pandas gives them to `op`."""
    return [as_missing(x, span) for x in operands] if op in INF_AS_MISSING else operands


def finish(op: str, operand: Tensor, n: int, span: Span, out: Tensor) -> Tensor:
    """`op`'s result as Qlib's gives it, given the operand before `prepare` and the window actually used."""
    if op not in NAN_WHERE_WINDOW_HOLDS_INF:
        return out
    return torch.where(window_holds_inf(operand, n, span), float("nan"), out)


def forget(span: Span, x: Tensor) -> None:
    """Drop what the pass keeps for x, and for its inf-as-missing copy (evaluate calls it when no later node
    reads x)."""
    kept = span.memo.pop(id(x), None)
    copy = kept[1].get(_FINITE) if kept else None
    if copy is not None and copy is not x:
        span.memo.pop(id(copy), None)
