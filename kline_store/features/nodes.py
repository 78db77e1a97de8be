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


@dataclass(frozen=True, eq=False, repr=False)
class Call:
    """An operator applied to operands. Its hash is computed once, from its operands' kept hashes, and equality
    is compared with an explicit stack: a tree thousands of levels deep (a long flat sum) hashes and compares
    without recursion."""

    op: str
    args: tuple["Node", ...]
    params: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.op, self.args, self.params)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Call):
            return NotImplemented
        stack = [(self, other)]
        while stack:
            a, b = stack.pop()
            if a is b:
                continue
            if isinstance(a, Call) and isinstance(b, Call):
                if a._hash != b._hash or a.op != b.op or a.params != b.params or len(a.args) != len(b.args):
                    return False
                stack.extend(zip(a.args, b.args))
            elif isinstance(a, Call) or isinstance(b, Call) or a != b:
                return False
        return True

    def __reduce__(self):
        return (Call, (self.op, self.args, self.params))  # the hash is made again where it is unpickled

    def __str__(self) -> str:
        done: dict[int, str] = {}
        for node in postorder([self]):
            if isinstance(node, Call):
                inner = [done[id(a)] if isinstance(a, Call) else str(a) for a in node.args]
                done[id(node)] = f"{node.op}({','.join(inner + [repr(p) for p in node.params])})"
        return done[id(self)]

    def __repr__(self) -> str:
        return f"Call<{self}>"


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


def postorder(roots) -> list["Node"]:
    """Every distinct node object under the roots (each once, by identity), operands before their users:
    an explicit stack, so depth costs no Python stack frames."""
    seen: set[int] = set()
    out: list[Node] = []
    for root in roots:
        if id(root) in seen:
            continue
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                out.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children(node)) if id(c) not in seen)
    return out


def fields_of(node: Node) -> frozenset[str]:
    """Every $field the expression reads."""
    return frozenset(n.name for n in postorder([node]) if isinstance(n, Field))
