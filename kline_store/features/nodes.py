"""The expression tree: immutable, hashable nodes, so equal subexpressions are one dictionary key.

A node is a `Field` ($close), a `Const` (a number) or a `Call` of one of Qlib's operators. `Call.args` holds
the expression operands, `Call.params` the numeric parameters Qlib takes as plain numbers (window N, the
quantile's qscore). `OPS` is the one table of operators: how many operands and parameters each takes and
which window values Qlib accepts, read from qlib/data/ops.py 0.9.7.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Field:
    name: str

    def __str__(self) -> str:
        return "$" + self.name


@dataclass(frozen=True)
class Const:
    value: float

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class Call:
    op: str
    args: tuple["Node", ...]
    params: tuple[float, ...] = ()

    def __str__(self) -> str:
        inner = [str(a) for a in self.args] + [repr(p) for p in self.params]
        return f"{self.op}({','.join(inner)})"


Node = Union[Field, Const, Call]


@dataclass(frozen=True)
class OpSpec:
    """n_args expression operands followed by the named numeric params; `window` says how N is checked:
    'any' (any integer, Ref), 'expanding' (integer >= 0, 0 = expanding), 'positive' (integer >= 1),
    'ema' (integer >= 0 or a float in (0, 1)), or None (no window)."""

    n_args: int
    params: tuple[str, ...] = ()
    window: str | None = None
    min_window: int = 1


_ELEM1 = OpSpec(1)
_ELEM2 = OpSpec(2)
_ROLL = OpSpec(1, ("N",), "expanding")

OPS: dict[str, OpSpec] = {
    "Abs": _ELEM1, "Log": _ELEM1, "Sign": _ELEM1,
    "Power": _ELEM2, "Add": _ELEM2, "Sub": _ELEM2, "Mul": _ELEM2, "Div": _ELEM2,
    "Greater": _ELEM2, "Less": _ELEM2, "Gt": _ELEM2, "Ge": _ELEM2, "Lt": _ELEM2, "Le": _ELEM2,
    "Eq": _ELEM2, "Ne": _ELEM2, "And": _ELEM2, "Or": _ELEM2,
    "If": OpSpec(3),
    "Ref": OpSpec(1, ("N",), "any"), "Delta": OpSpec(1, ("N",), "any"),  # x - shift(N): any integer
    "Mean": _ROLL, "Sum": _ROLL, "Std": _ROLL, "Var": _ROLL, "Max": _ROLL, "Min": _ROLL,
    "IdxMax": _ROLL, "IdxMin": _ROLL, "Med": _ROLL, "Mad": _ROLL, "Rank": _ROLL, "Count": _ROLL,
    "Slope": _ROLL, "Rsquare": _ROLL, "Resi": _ROLL, "WMA": _ROLL,
    # Qlib raises for 0 < N < 3 (Skew) and 0 < N < 4 (Kurt, despite its message saying 5).
    "Skew": OpSpec(1, ("N",), "expanding", 3), "Kurt": OpSpec(1, ("N",), "expanding", 4),
    "Quantile": OpSpec(1, ("N", "qscore"), "expanding"),
    "EMA": OpSpec(1, ("N",), "ema"),
    # Qlib has no expanding pair operator: for N=0 PairRolling's extended window is -inf, and D.features
    # fails on the index range (Corr's std guard would also call rolling(0), which pandas refuses).
    "Corr": OpSpec(2, ("N",), "positive"), "Cov": OpSpec(2, ("N",), "positive"),
    # Cross-sectional (not Qlib's: it has them only as processors), cross_section.py: over each day's symbols.
    "CSRank": _ELEM1, "CSZScore": _ELEM1, "CSDemean": _ELEM1, "CSScale": _ELEM1,
    "GroupDemean": _ELEM2, "GroupRank": _ELEM2,
}


def children(node: Node) -> tuple[Node, ...]:
    return node.args if isinstance(node, Call) else ()


def fields_of(node: Node) -> frozenset[str]:
    """Every $field the expression reads."""
    if isinstance(node, Field):
        return frozenset((node.name,))
    return frozenset().union(*(fields_of(c) for c in children(node)))
