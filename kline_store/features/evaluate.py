"""Many named Qlib expressions over one block of the panel at once, each distinct subexpression computed once.

values: field -> [S, T] tensor (float32 as the store keeps it), first/last: each symbol's span as inclusive
bar indices on the block. Every cell inside a span gets what Qlib's D.features gives for that instrument and
day; cells outside are NaN. Windows are truncated at `first` as Qlib's series start there, so to reproduce
Qlib's values on a block that starts after a symbol's first bar, give the block `lookback` bars of history
(first < 0 says the series began before the block; expanding windows (lookback None) need the whole series).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import torch
from torch import Tensor

from kline_store.errors import InputError

from .nodes import Call, Const, Field, Node, children, fields_of
from .ops import apply
from .parse import parse
from .window import Span, mask

Expr = Union[str, Node]


@dataclass(frozen=True)
class Evaluation:
    values: Tensor  # float32 [S, T, n_expr]
    names: tuple[str, ...]
    missing_fields: frozenset[str]  # fields the expressions read that `values` lacked: read as NaN, as Qlib
    n_computed: int  # distinct operator nodes evaluated (each once, however often the expressions share it)


def lookback(node: Node) -> int | None:
    """Bars of history (before the current one) the expression reads; None: the whole series (N = 0, EMA)."""
    if isinstance(node, (Field, Const)):
        return 0
    backs = [lookback(c) for c in node.args]
    if any(b is None for b in backs):
        return None
    back = max(backs)
    if node.op in ("Ref", "Delta"):
        n = int(node.params[0])
        return None if n == 0 else back + max(n, 0)
    if node.op == "EMA":
        return None  # pandas ewm weighs every earlier row
    if node.params:
        n = int(node.params[0])
        return None if n == 0 else back + n - 1
    return back


def lookahead(node: Node) -> int:
    """Bars after the current one the expression reads (Ref with negative N): LABEL0 looks 2 ahead."""
    if isinstance(node, (Field, Const)):
        return 0
    ahead = max(lookahead(c) for c in node.args)
    if node.op in ("Ref", "Delta") and node.params[0] < 0:
        return ahead - int(node.params[0])
    return ahead


def _order(roots: Sequence[Node]) -> tuple[list[Call], Counter]:
    """Distinct Call nodes, operands before their users, and how many times each is used as an operand."""
    seen: set[Node] = set()
    order: list[Call] = []
    uses: Counter = Counter()

    def visit(node: Node) -> None:
        if node in seen or not isinstance(node, Call):
            return
        seen.add(node)
        for child in node.args:
            uses[child] += 1
            visit(child)
        order.append(node)
    for root in roots:
        visit(root)
    return order, uses


def evaluate(exprs: Mapping[str, Expr] | Sequence[Expr], values: Mapping[str, Tensor], first: Tensor,
             last: Tensor) -> Evaluation:
    """Evaluate the expressions (a name -> expression mapping, or a list named by the expressions' text)."""
    named = dict(exprs) if isinstance(exprs, Mapping) else {str(e): e for e in exprs}
    roots = [parse(e) if isinstance(e, str) else e for e in named.values()]
    if not values:
        raise InputError("evaluate: no field values given")
    sample = next(iter(values.values()))
    if sample.ndim != 2:
        raise InputError(f"evaluate: field tensors must be [symbols, bars], got shape {tuple(sample.shape)}")
    n_sym, n_bars = sample.shape
    span = Span(first.to(device=sample.device, dtype=torch.int64), last.to(device=sample.device, dtype=torch.int64),
                n_bars)
    wanted = frozenset().union(*(fields_of(r) for r in roots))
    missing = frozenset(f for f in wanted if f not in values)
    cache: dict[Node, Tensor] = {}
    for name in wanted:
        src = values.get(name)
        cache[Field(name)] = mask(src if src is not None else torch.full_like(sample, float("nan")), span)

    order, uses = _order(roots)
    root_set = set(roots)
    for node in order:
        args = [a.value if isinstance(a, Const) else cache[a] for a in node.args]
        cache[node] = mask(apply(node.op, args, node.params, span), span)
        for child in node.args:  # free operands no later node needs
            uses[child] -= 1
            if uses[child] == 0 and child not in root_set and not isinstance(child, Field):
                cache.pop(child, None)

    out = torch.empty((n_sym, n_bars, len(roots)), dtype=torch.float32, device=sample.device)
    for k, root in enumerate(roots):
        res = cache[root] if not isinstance(root, Const) else mask(torch.full_like(sample, root.value), span)
        out[..., k] = res.to(torch.float32)
    return Evaluation(out, tuple(named), missing, len(order))
