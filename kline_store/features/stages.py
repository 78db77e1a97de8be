"""Cross-sectional operators over a panel evaluated in symbol blocks: a block holds some symbols of each day, a
cross-section needs all of them, so the operators are evaluated between block passes.

Stage by stage, innermost first: the operands of the cross-sectional nodes that hold no other one are evaluated
over every block (`run`: expressions -> [n, symbols, bars] float64 of the whole panel), each node's kernel runs
on the whole panel, and its result becomes a pseudo-field (a name no expression can spell) that replaces the
node in every expression. When no cross-sectional node is left, the rewritten expressions go through the usual
block passes with the pseudo-fields as inputs. Values equal a single pass over all symbols cell for cell (same
float64 operands, same kernels); a subexpression shared by a stage and the final pass is computed in each.
Memory: one [symbols, bars] float64 panel per distinct cross-sectional node that a later stage or the final pass
still reads (a node read only by another cross-sectional node is freed once that one is made), plus the operands of
one call of `run` (bounded by max_operands).
"""

from __future__ import annotations

import itertools
from typing import Callable

from torch import Tensor

from .cross_section import KERNELS, distinct_nodes, rebuild
from .nodes import Call, Field, Node

PSEUDO = "cs#{}"                        # '#' is no field character: a user's $name cannot collide
MEMBERS = Field("universe#members")     # 1 on a universe member day, NaN otherwise (cross_section.restrict)

Run = Callable[[dict[str, Node], dict[str, Tensor]], Tensor]


def _innermost(roots: list[Node]) -> list[Call]:
    """The distinct cross-sectional nodes whose operands hold no cross-sectional node, in a stable order."""
    holds: dict[Node, bool] = {}                      # the subtree holds a cross-sectional node
    out: list[Call] = []
    for node in distinct_nodes(roots):
        inner = isinstance(node, Call) and any(holds[a] for a in node.args)
        cross = isinstance(node, Call) and node.op in KERNELS
        if cross and not inner:
            out.append(node)
        holds[node] = cross or inner
    return out


def stage(roots: list[Node], run: Run, max_operands: int | None = None) -> tuple[list[Node], dict[str, Tensor]]:
    """The expressions without cross-sectional nodes, and the pseudo-fields ([symbols, bars] float64) they read.
    ``run(exprs, pseudo)`` evaluates expressions free of cross-sectional nodes over the whole panel, given the
    pseudo-fields made so far; ``max_operands`` bounds how many operand panels one call returns (None: a stage's
    all at once)."""
    pseudo: dict[str, Tensor] = {}
    counter = itertools.count()
    while True:
        ready = _innermost(roots)
        if not ready:
            return roots, pseudo
        done: dict[Node, Field] = {}
        for part in _parts(ready, max_operands):
            slot: dict[Node, int] = {}
            for node in part:
                for a in node.args:
                    slot.setdefault(a, len(slot))
            values = run({f"operand{k}": a for a, k in slot.items()}, pseudo)
            for node in part:
                name = PSEUDO.format(next(counter))
                pseudo[name] = KERNELS[node.op](*(values[slot[a]] for a in node.args))
                done[node] = Field(name)
            del values
        roots = rebuild(roots, lambda call, args: done.get(call) or Call(call.op, args, call.params))
        read = {n.name for n in distinct_nodes(roots) if isinstance(n, Field)}
        for name in [p for p in pseudo if p not in read]:   # read only by nodes now replaced: free it
            del pseudo[name]


def _parts(nodes: list[Call], max_operands: int | None) -> list[list[Call]]:
    """Consecutive groups of nodes holding at most max_operands operands each (a node's own stay together)."""
    if max_operands is None:
        return [nodes]
    out: list[list[Call]] = [[]]
    count = 0
    for node in nodes:
        if out[-1] and count + len(node.args) > max_operands:
            out.append([])
            count = 0
        out[-1].append(node)
        count += len(node.args)
    return out
