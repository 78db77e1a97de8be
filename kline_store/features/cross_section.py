"""Cross-sectional operators: each day's values across the symbols, as pure torch functions over [symbols, bars].

    CSRank(e)            pandas' groupby(datetime).rank(pct=True): average rank of ties / the day's valid count
                         (Qlib's CSRankNorm before its (r - 0.5) * 3.46)
    CSZScore(e)          (e - mean) / std (pandas' std, ddof=1), Qlib's CSZScoreNorm
    CSDemean(e)          e - mean
    CSScale(e)           e / sum(|e|): alpha101's scale (the day's absolute values sum to 1)
    GroupDemean(e, g)    e - mean of e over the day's symbols with the same group value g (industry codes as a field)
    GroupRank(e, g)      CSRank within the day's symbols of the same group value

A symbol counts in a day's cross-section where e (and g) is not NaN: NaN cells, cells outside a symbol's span and
(with a universe) non-members are left out and come out NaN. Infinities count as the extremes they are, as pandas
(a mean or a sum that meets one is infinite, a std NaN). Statistics in float64 whatever the operand.

rank_pct, nanmean and nanstd are also Qlib's processors' reductions (processors.py imports them from here).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .nodes import Call, Field, Node

NAN = float("nan")


# ---------------------------------------------------------------- pandas / numpy reductions, NaN-skipping


def nanmean(v: Tensor, dim: int) -> Tensor:
    """pandas' skipna mean: NaN skipped, infinities kept, NaN when nothing is left (keeps dim)."""
    valid = ~torch.isnan(v)
    total = torch.where(valid, v, 0.0).sum(dim, keepdim=True)
    return total / valid.sum(dim, keepdim=True)  # 0/0 is NaN: an all-NaN slice has no mean


def nanstd(v: Tensor, dim: int, ddof: int) -> Tensor:
    """Two-pass NaN-skipping std as pandas (ddof=1) and numpy (ddof=0) take it: NaN when count <= ddof, and NaN
    as soon as an infinity is in the slice (inf - inf), as theirs."""
    valid = ~torch.isnan(v)
    n = valid.sum(dim, keepdim=True)
    dev = torch.where(valid, v - nanmean(v, dim), 0.0)
    var = (dev * dev).sum(dim, keepdim=True) / (n - ddof)
    return torch.where(n > ddof, var.sqrt(), NAN)


def rank_pct(v: Tensor) -> Tensor:
    """pandas' `rank(pct=True)` along the last dim: average rank of ties, divided by the count of non-NaN
    values; NaN stays NaN; infinities rank as the extreme values they are."""
    ordered, order = torch.sort(v, dim=-1)
    pos = torch.arange(v.shape[-1], dtype=v.dtype, device=v.device).expand_as(ordered)  # float: ranks in v's precision
    first, last = _run_edges(ordered[..., 1:] == ordered[..., :-1])
    start = torch.where(first, pos, 0).cummax(-1).values  # the first position of each run of equal values
    end = torch.where(last, pos, v.shape[-1]).flip(-1).cummin(-1).values.flip(-1)  # ... and its last
    n = (~torch.isnan(v)).sum(-1, keepdim=True)
    pct = torch.where(torch.isnan(ordered), NAN, ((start + end) / 2 + 1) / n)
    return torch.empty_like(pct).scatter_(-1, order, pct)


def _run_edges(same: Tensor) -> tuple[Tensor, Tensor]:
    """From same[..., i] (element i + 1 equals element i, along the last dim of a sorted tensor): where each run
    of equal elements starts and where it ends."""
    shape = same.shape[:-1] + (same.shape[-1] + 1,)
    first = torch.ones(shape, dtype=torch.bool, device=same.device)
    first[..., 1:] = ~same
    last = torch.ones(shape, dtype=torch.bool, device=same.device)
    last[..., :-1] = ~same
    return first, last


# ---------------------------------------------------------------- the operators over [symbols, bars]


def _f64(x: Tensor) -> Tensor:
    return x.to(torch.float64)


def cs_rank(x: Tensor) -> Tensor:
    return rank_pct(_f64(x).T).T


def cs_zscore(x: Tensor) -> Tensor:
    x = _f64(x)
    return (x - nanmean(x, 0)) / nanstd(x, 0, ddof=1)


def cs_demean(x: Tensor) -> Tensor:
    x = _f64(x)
    return x - nanmean(x, 0)


def cs_scale(x: Tensor) -> Tensor:
    x = _f64(x)
    return x / torch.where(torch.isnan(x), 0.0, x.abs()).sum(0, keepdim=True)


def _groups(x: Tensor, group: Tensor) -> tuple[Tensor, Tensor, int]:
    """The cells that count (x and the group valid) and, for them, one id per (day, group value)."""
    valid = ~torch.isnan(x) & ~torch.isnan(group)
    _, gid = torch.unique(group[valid], return_inverse=True)
    n_groups = int(gid.max()) + 1 if gid.numel() else 1
    day = torch.arange(x.shape[1], device=x.device).expand_as(x)[valid]
    return valid, day * n_groups + gid, n_groups * x.shape[1]


def group_demean(x: Tensor, group: Tensor) -> Tensor:
    x, group = _f64(x), _f64(group)
    valid, key, n_keys = _groups(x, group)
    vals = x[valid]
    total = torch.zeros(n_keys, dtype=torch.float64, device=x.device).index_add_(0, key, vals)
    count = torch.zeros(n_keys, dtype=torch.float64, device=x.device).index_add_(0, key, torch.ones_like(vals))
    out = torch.full_like(x, NAN)
    out[valid] = vals - total[key] / count[key]
    return out


def group_rank(x: Tensor, group: Tensor) -> Tensor:
    x, group = _f64(x), _f64(group)
    valid, key, _ = _groups(x, group)
    vals = x[valid]
    by_value = torch.sort(vals, stable=True).indices
    order = by_value[torch.sort(key[by_value], stable=True).indices]  # by key, then by value
    k, v = key[order], vals[order]
    pos = torch.arange(len(v), dtype=torch.float64, device=x.device)
    new_key = torch.ones(len(k), dtype=torch.bool, device=x.device)
    new_key[1:] = k[1:] != k[:-1]
    first, last = _run_edges((k[1:] == k[:-1]) & (v[1:] == v[:-1]))
    start = torch.where(first, pos, 0).cummax(0).values
    end = torch.where(last, pos, len(v)).flip(0).cummin(0).values.flip(0)
    seg = torch.where(new_key, pos, 0).cummax(0).values                  # where the (day, group) starts
    seg_id = torch.cumsum(new_key, 0) - 1
    count = torch.bincount(seg_id).to(torch.float64)[seg_id]           # valid cells of the (day, group)
    pct = ((start + end) / 2 - seg + 1) / count
    ranked = torch.empty_like(vals)
    ranked[order] = pct
    out = torch.full_like(x, NAN)
    out[valid] = ranked
    return out


KERNELS: dict[str, Callable[..., Tensor]] = {
    "CSRank": cs_rank, "CSZScore": cs_zscore, "CSDemean": cs_demean, "CSScale": cs_scale,
    "GroupDemean": group_demean, "GroupRank": group_rank,
}


def distinct_nodes(roots: list[Node]) -> list[Node]:
    """Distinct nodes of the trees (equal subtrees once), operands before their users: a loop over an explicit
    stack (a sum of thousands of terms is a tree thousands deep)."""
    seen: set[Node] = set()
    out: list[Node] = []
    stack = [(r, False) for r in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            out.append(node)
        elif node not in seen:
            seen.add(node)
            stack.append((node, True))
            if isinstance(node, Call):
                stack.extend((a, False) for a in reversed(node.args))
    return out


def rebuild(roots: list[Node], make: Callable[[Call, tuple[Node, ...]], Node]) -> list[Node]:
    """The trees with every Call replaced by make(call, its rebuilt operands), each distinct node once."""
    new: dict[Node, Node] = {}
    for node in distinct_nodes(roots):
        new[node] = make(node, tuple(new[a] for a in node.args)) if isinstance(node, Call) else node
    return [new[r] for r in roots]


def crossing(node: Node) -> bool:
    """The expression holds a cross-sectional operator (its value on a symbol depends on other symbols)."""
    return any(isinstance(n, Call) and n.op in KERNELS for n in distinct_nodes([node]))


def restrict(node: Node, members: Field) -> Node:
    """The expression with each cross-sectional operand multiplied by the members field (1 on a member day, NaN
    otherwise): non-members drop out of every cross-section and come out NaN."""
    def make(call: Call, args: tuple[Node, ...]) -> Node:
        if call.op in KERNELS:
            args = (Call("Mul", (args[0], members)),) + args[1:]
        return Call(call.op, args, call.params)
    return rebuild([node], make)[0]
