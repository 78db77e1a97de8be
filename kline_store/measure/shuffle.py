"""Shuffle quality of an epoch's order, as pure metrics over what the batches hold.

Compare the block order with a uniform permutation on the same store: per batch, the distinct blocks, symbols
and dates (against ``K (1 - e^(-b/K))`` for b draws from K equally likely blocks), the spread of dates inside a
batch; over the epoch, the rank correlation of delivery position and sample index (about 0 for a good shuffle),
exactly-once coverage, disjoint ranks, and whether a resumed order equals the original.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def expected_distinct(pool: int, batch: int) -> float:
    """Expected distinct blocks among ``batch`` uniform draws from ``pool`` equally likely blocks."""
    return float(pool * -np.expm1(-batch / max(pool, 1)))


def per_batch_distinct(keys: np.ndarray, batch_size: int) -> np.ndarray:
    """Distinct values of ``keys`` in each full batch of ``batch_size`` consecutive entries."""
    nb = len(keys) // batch_size
    if nb == 0:
        return np.zeros(0)
    k = np.sort(np.asarray(keys[: nb * batch_size]).reshape(nb, batch_size), axis=1)
    return 1 + (np.diff(k, axis=1) != 0).sum(axis=1)


def date_spread(t: np.ndarray, batch_size: int) -> np.ndarray:
    """Interquartile range of the window end days in each full batch."""
    nb = len(t) // batch_size
    if nb == 0:
        return np.zeros(0)
    q = np.percentile(np.asarray(t[: nb * batch_size], dtype=np.float64).reshape(nb, batch_size), [25, 75], axis=1)
    return q[1] - q[0]


def rank_correlation(order: np.ndarray) -> float:
    """Spearman correlation of delivery position and sample index (``order`` holds distinct indices)."""
    n = len(order)
    if n < 3:
        return 0.0
    ranks = np.empty(n, dtype=np.float64)
    ranks[np.argsort(order, kind="stable")] = np.arange(n, dtype=np.float64)
    pos = np.arange(n, dtype=np.float64)
    return float(np.corrcoef(pos, ranks)[0, 1])


def coverage(orders: Sequence[np.ndarray], n: int) -> dict[str, Any]:
    """Exactly-once check over the ranks' orders of one epoch: missing, repeated, and overlapping ranks."""
    allx = np.concatenate([np.asarray(o, dtype=np.int64) for o in orders]) if orders else np.zeros(0, np.int64)
    counts = np.bincount(allx, minlength=n) if n else np.zeros(0, np.int64)
    sets = [set(np.asarray(o).tolist()) for o in orders]
    overlap = sum(len(sets[i] & sets[j]) for i in range(len(sets)) for j in range(i + 1, len(sets)))
    return {"missing": int((counts == 0).sum()), "repeated": int((counts > 1).sum()), "overlap": int(overlap),
            "delivered": int(len(allx))}


def quality(order: np.ndarray, symbol: np.ndarray, t: np.ndarray, block: np.ndarray, batch_size: int,
            pool: int | None = None) -> dict[str, float]:
    """One row of the shuffle-quality table for an epoch's order (sample indices, in delivery order) and each
    delivered sample's symbol, day and block."""
    row = {"batch": batch_size,
           "blocks/batch": float(per_batch_distinct(block, batch_size).mean()),
           "symbols/batch": float(per_batch_distinct(symbol, batch_size).mean()),
           "dates/batch": float(per_batch_distinct(t, batch_size).mean()),
           "date IQR": float(np.median(date_spread(t, batch_size))),
           "rank corr": rank_correlation(np.asarray(order))}
    if pool is not None:
        row["K(1-e^-b/K)"] = expected_distinct(pool, batch_size)
    return row


__all__ = ["coverage", "date_spread", "expected_distinct", "per_batch_distinct", "quality", "rank_correlation"]
