"""Many named Qlib expressions over one block of the panel at once, each distinct subexpression computed once.

values: lower-case field name -> [S, T] tensor, float32 as the store keeps it and Qlib reads it (element-wise
steps stay in the fields' dtype, as numpy keeps Qlib's float32: float64 fields would lose that rounding, e.g.
$high-$low+1e-12 being 0); first/last: each symbol's span as inclusive bar indices on the block.

Every cell inside a span gets what Qlib's D.features gives for that instrument and day; cells outside are
NaN. Windows are truncated at `first` as Qlib's series start there, so to reproduce Qlib's values on a block
that starts after a symbol's first bar, give the block `lookback` bars of history (first < 0 says the series
began before the block; expanding windows (lookback None) need the whole series).
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from kline_store.errors import InputError

from . import infinity
from .cross_section import crossing, restrict
from .nodes import Call, Const, Field, Node, fields_of, postorder
from .ops import apply
from .parse import parse
from .stages import MEMBERS, stage
from .window import Span, mask

Expr = Union[str, Node]
# Most expressions one evaluation (and one features store) may hold: Alpha158 and Alpha360 together are 518.
MAX_EXPRESSIONS = 10000


@dataclass(frozen=True)
class Evaluation:
    values: Tensor  # float32 [S, T, n_expr]: a view of an expression-major [n_expr, S, T] tensor
    names: tuple[str, ...]
    missing_fields: frozenset[str]  # fields the expressions read that `values` lacked: read as NaN, as Qlib
    n_computed: int  # distinct operator nodes evaluated (each once, however often the expressions share it)
    lookback: tuple[int | None, ...]  # per expression: bars of history it reads (None: the whole series)
    lookahead: tuple[int, ...]  # per expression: bars ahead it reads


def _own_back(node: Call, back: int | None) -> int | None:
    """Bars of history `node` reads, given the most its operands read."""
    if back is None:
        return None
    if node.op in ("Ref", "Delta"):
        n = int(node.params[0])
        return None if n == 0 else back + max(n, 0)
    if node.op == "EMA":
        return None  # pandas ewm weighs every earlier row
    if node.params:
        n = int(node.params[0])
        return None if n == 0 else back + n - 1
    return back


def lookback(node: Node) -> int | None:
    """Bars of history (before the current one) the expression reads; None: the whole series (N = 0, EMA)."""
    reach: dict[int, int | None] = {}
    for n in postorder([node]):
        if isinstance(n, Call):
            backs = [reach.get(id(c), 0) for c in n.args]
            reach[id(n)] = _own_back(n, None if None in backs else max(backs))
    return reach.get(id(node), 0)


def lookahead(node: Node) -> int:
    """Bars after the current one the expression reads (Ref with negative N): LABEL0 looks 2 ahead."""
    reach: dict[int, int] = {}
    for n in postorder([node]):
        if isinstance(n, Call):
            ahead = max(reach.get(id(c), 0) for c in n.args)
            if n.op in ("Ref", "Delta") and n.params[0] < 0:
                ahead -= int(n.params[0])
            reach[id(n)] = ahead
    return reach.get(id(node), 0)


def windows(exprs: Mapping[str, Expr] | Sequence[Expr]) -> dict[str, tuple[int | None, int]]:
    """name -> (lookback, lookahead) of each expression, from the trees alone: how much history and future a
    block needs around the bars it should fill."""
    named = _named(exprs)
    trees = {name: parse(e) if isinstance(e, str) else e for name, e in named.items()}
    return {name: (lookback(t), lookahead(t)) for name, t in trees.items()}


def _named(exprs: Mapping[str, Expr] | Sequence[Expr]) -> dict[str, Expr]:
    named = dict(exprs) if isinstance(exprs, Mapping) else {str(e): e for e in exprs}
    if len(named) > MAX_EXPRESSIONS:
        raise InputError(f"{len(named):,} expressions, more than the {MAX_EXPRESSIONS:,} one evaluation may "
                         "hold; split them into several feature stores")
    return named


def _order(roots: Sequence[Node]) -> tuple[list[Call], Counter]:
    """Distinct Call nodes (equal subtrees once), operands before their users, and how many times each is
    used as an operand. A loop over an explicit stack: deep trees need no recursion."""
    seen: set[Node] = set()
    order: list[Call] = []
    uses: Counter = Counter()
    for root in roots:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen or not isinstance(node, Call):
                continue
            seen.add(node)
            stack.append((node, True))
            for child in reversed(node.args):
                uses[child] += 1
                stack.append((child, False))
    return order, uses


# Operators whose result is NaN wherever an operand is NaN (so outside the span, where every operand is
# NaN): their output needs no mask. Comparisons, And/Or, If and Power (x ** 0 is 1) do not propagate NaN.
_NAN_IN_NAN_OUT = frozenset({"Add", "Sub", "Mul", "Div", "Abs", "Log", "Sign", "Greater", "Less"})


def _one_pass(roots: list[Node], order: list[Call], values: Mapping[str, Tensor], first: Tensor, last: Tensor,
              wanted: frozenset[str], out: Tensor) -> None:
    """All expressions on some symbols, into out [n_expr, S, T]."""
    sample = next(iter(values.values()))
    span = Span(first.to(device=sample.device, dtype=torch.int64),
                last.to(device=sample.device, dtype=torch.int64), sample.shape[1])
    cache: dict[Node, Tensor] = {}
    for name in wanted:
        src = values.get(name)
        cache[Field(name)] = mask(src if src is not None else torch.full_like(sample, float("nan")), span)
    slots: dict[Node, list[int]] = {}
    for k, root in enumerate(roots):
        slots.setdefault(root, []).append(k)
        if isinstance(root, Field):  # a bare $field
            out[k] = cache[root]
        elif isinstance(root, Const):  # a number: through float64, so that 1e100 is inf, not an overflow error
            out[k] = mask(torch.full_like(sample, float(root.value), dtype=torch.float64).to(sample.dtype), span)
    _, uses = _order(roots)
    for node in order:
        args = [_scalar(a.value) if isinstance(a, Const) else cache[a] for a in node.args]
        value = apply(node.op, args, node.params, span)
        if not (node.op in _NAN_IN_NAN_OUT and isinstance(value, Tensor) and value.is_floating_point()
                and any(isinstance(a, Tensor) for a in args)):
            value = mask(value, span)
        cache[node] = value
        for k in slots.get(node, ()):
            out[k] = value
        for child in node.args:  # free operands no later node needs, and what the memo keeps of them
            uses[child] -= 1
            if uses[child] == 0 and child in cache:
                infinity.forget(span, cache[child])
                if isinstance(child, Call):
                    del cache[child]
        if uses[node] == 0:  # a root no other node reads: it is in `out` already
            del cache[node]


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised tensor; on the CPU numpy's memory, which asks the kernel for huge pages (madvise) where
    torch's allocator does not: the output of a whole block (136 MB for Alpha158 on 154 x 1,395) then costs a
    few dozen page faults instead of ~33,000 (measured ~0.05 CPU s of kernel time a call)."""
    as_numpy = {torch.float32: np.float32, torch.float64: np.float64}.get(dtype)
    if device.type != "cpu" or as_numpy is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.empty(shape, dtype=as_numpy))


def _buffer(given: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """The leading [shape] of ``given`` when it is large enough, else a new tensor (``_empty``)."""
    if given is None or given.dtype != dtype or given.device != device or given.dim() != 3 or \
            given.shape[0] != shape[0] or given.shape[2] != shape[2] or given.shape[1] < shape[1]:
        return _empty(shape, dtype, device)
    return given[:, : shape[1]]


def _scalar(value: int | float) -> int | float:
    """A constant as torch takes it: an integer past int64 (1e30 written out) as the float it is anyway."""
    return float(value) if isinstance(value, int) and abs(value) >= 2 ** 53 else value


def _check(values: Mapping[str, Tensor], first: Tensor, last: Tensor) -> tuple[int, int]:
    if not values:
        raise InputError("evaluate: no field values given")
    shapes = {name: tuple(v.shape) for name, v in values.items()}
    shape = next(iter(shapes.values()))
    if len(shape) != 2 or len(set(shapes.values())) != 1:
        raise InputError(f"evaluate: field tensors must all be [symbols, bars], got {shapes}")
    if tuple(first.shape) != shape[:1] or tuple(last.shape) != shape[:1]:
        raise InputError(f"evaluate: first/last must be [symbols] = [{shape[0]}], got {tuple(first.shape)} "
                         f"and {tuple(last.shape)}")
    return shape


# Symbols one threaded task takes at least: a pass over a block costs ~25 ms of Python and dispatch whatever
# its size, so tasks much smaller than this would spend their time there.
MIN_TASK_SYMBOLS = 32


def threads_for(threads: int | None) -> int:
    """Worker threads for evaluate: the given count, else torch's (torch.set_num_threads, OMP_NUM_THREADS)."""
    if threads is None:
        return max(1, torch.get_num_threads())
    if int(threads) < 1:
        raise InputError(f"threads={threads}: expected 1 or more")
    return int(threads)


@contextmanager
def _one_intra_op_thread():
    """torch's own (intra-op) threads set to 1 while the blocks run, the caller's count restored after: ~4,400
    small kernels each followed by an OpenMP barrier make torch's threads slower than one (3x on a machine
    where another process holds a core); parallelism comes from the symbol blocks instead. Python's cyclic
    garbage collector is paused meanwhile (the caller's setting restored after): the pass makes many small
    objects, which start full collections over every object of the process (4% of the time at 1,000 x 2,500,
    measured with perf); the pass makes no reference cycles, and whatever cycle there is waits for the next
    collection."""
    before, collecting = torch.get_num_threads(), gc.isenabled()
    torch.set_num_threads(1)
    gc.disable()
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if collecting:
            gc.enable()


def evaluate(exprs: Mapping[str, Expr] | Sequence[Expr], values: Mapping[str, Tensor], first: Tensor,
             last: Tensor, symbols_per_pass: int | None = None, members: Tensor | None = None,
             dtype: torch.dtype = torch.float32, threads: int | None = None,
             out: Tensor | None = None) -> Evaluation:
    """Evaluate the expressions (a name -> expression mapping, or a list named by the expressions' text) on
    one block: values field -> [S, T], first/last [S]. Each distinct subexpression is computed once, and
    freed as soon as nothing left needs it. symbols_per_pass bounds memory on a large panel (symbols interact
    only in cross-sectional operators, evaluated over all symbols between passes: stages.py; the passes give
    the same values). members: bool [S, T], a universe's member days: cross-sections hold those only
    (other cells of a cross-sectional operator are NaN). dtype: of the values returned. threads (default:
    torch.get_num_threads()): on the CPU, blocks of symbols run side by side, one task a block, each with one
    torch thread; the values are the same whatever the count. out: a buffer to reuse for the values, at least
    [n_expr, S, T] of ``dtype`` on the values' device (its leading part is used; a caller evaluating block
    after block saves a fresh allocation each time)."""
    named = _named(exprs)
    roots = [parse(e) if isinstance(e, str) else e for e in named.values()]
    n_sym, n_bars = _check(values, first, last)
    sample = next(iter(values.values()))
    wanted = frozenset().union(*(fields_of(r) for r in roots))
    missing = frozenset(f for f in wanted if f not in values)
    order, _ = _order(roots)
    n_computed = len(order)
    step = symbols_per_pass or max(1, n_sym)
    workers = threads_for(threads) if sample.device.type == "cpu" else 1
    if workers > 1:  # a few tasks a worker, so that one slowed by a busy core hands work to the others
        step = min(step, max(MIN_TASK_SYMBOLS, math.ceil(n_sym / (4 * workers))))
    # after the split into tasks: cross-sections over tasks' symbols would be wrong (stages.py)
    if any(crossing(r) for r in roots):
        roots, values = _cross(roots, values, first, last, step, members, threads)
        wanted = frozenset().union(*(fields_of(r) for r in roots))
        order, _ = _order(roots)
    # Expression-major while computing (each result one contiguous write), [S, T, n_expr] once at the end.
    out = _buffer(out, (len(roots), n_sym, n_bars), dtype, sample.device)
    tasks = [slice(s0, min(n_sym, s0 + step)) for s0 in range(0, n_sym, step)]

    def task(rows: slice) -> None:
        part = {name: v[rows] for name, v in values.items()}
        _one_pass(roots, order, part, first[rows], last[rows], wanted, out[:, rows])

    if sample.device.type != "cpu":
        for rows in tasks:
            task(rows)
    elif workers == 1 or len(tasks) == 1:
        with _one_intra_op_thread():
            for rows in tasks:
                task(rows)
    else:
        with _one_intra_op_thread(), ThreadPoolExecutor(min(workers, len(tasks)), initializer=torch.set_num_threads,
                                                        initargs=(1,)) as pool:
            for done in [pool.submit(task, rows) for rows in tasks]:
                done.result()
    return Evaluation(out.permute(1, 2, 0), tuple(named), missing, n_computed, tuple(lookback(r) for r in roots),
                      tuple(lookahead(r) for r in roots))


def _cross(roots: list[Node], values: Mapping[str, Tensor], first: Tensor, last: Tensor, step: int,
           members: Tensor | None, threads: int | None) -> tuple[list[Node], dict[str, Tensor]]:
    """Roots and values for the passes: cross-sections restricted to the members, and evaluated over every
    symbol between the passes when the passes split the symbols."""
    values = dict(values)
    if members is not None:
        sample = next(iter(values.values()))
        values[MEMBERS.name] = torch.where(members.to(sample.device), 1.0, float("nan")).to(torch.float32)
        roots = [restrict(r, MEMBERS) for r in roots]
    if step >= first.shape[0]:
        return roots, values       # one pass holds every symbol: the operators run in it

    def run(operands: dict[str, Node], pseudo: dict[str, Tensor]) -> Tensor:
        ev = evaluate(operands, {**values, **pseudo}, first, last, step, dtype=torch.float64, threads=threads)
        return ev.values.permute(2, 0, 1)
    roots, pseudo = stage(roots, run)
    return roots, {**values, **pseudo}
