"""Block order for stores bigger than memory, as pure functions over per-block window counts.

A *block* is a contiguous run of one symbol's windows (a few hundred KiB to a few MiB of bars, plus the window's
halo); the dataset knows how many valid windows each holds (``counts``), never which ones until it reads the block.
Sample positions are the dataset's: block ``b`` holds positions ``offsets[b] .. offsets[b] + counts[b]``, in the
order of the uniform loader's index, so both orders draw from the same multiset of samples.

    rank_pieces(counts, seed, rank, world)      this rank's share: whole blocks and at most two parts of blocks,
                                                fixed across epochs (a node rereads its share from its page cache)
      -> RoundPlan(pieces, seed, epoch, K, L)   pieces permuted by (seed, epoch, rank); a pool of K live pieces:
                                                each lives L rounds, m = K / L enter and leave per round, and its
                                                windows are spread evenly over its rounds
        -> round_positions(r)                   the windows of round r (K pieces' shares), shuffled together

So every window comes exactly once per epoch, every batch is drawn uniformly from the windows of the K live blocks
(about ``K (1 - exp(-b / K))`` distinct blocks in a batch of b), K does not depend on the batch size, and at any
time K + m blocks are resident: memory is O(blocks) for the plan plus O(K x block) for one round's positions.
The first and last ``L - 1`` groups of pieces live fewer rounds (the pool is full from the first round on).

The rank's part of the epoch has ``shard_size(n, world, tail, rank)`` samples, as for the uniform order: ``tail="pad"``
repeats the rank's first window when its share is one short, ``"drop"`` leaves its last one out, ``"uneven"`` keeps
the share as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .sampling import Tail, own_size, shard_size


def _seed(*parts: int) -> int:
    state = np.random.SeedSequence([int(p) & (2**63 - 1) for p in parts]).generate_state(1, np.uint64)[0]
    return int(state) & (2**63 - 1)


def _perm(n: int, *parts: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(_seed(*parts))
    return torch.randperm(n, generator=gen, dtype=torch.int64).numpy()


# Streams of randomness, so that no two uses of (seed, epoch, rank) share one.
_ASSIGN, _PIECES, _AFFINE, _ROUND = 0x5A1, 0x5A2, 0x5A3, 0x5A4


@dataclass(frozen=True)
class Pieces:
    """A rank's share: block ids and window ranges ``[j0, j1)`` inside each (positions ``start + j``)."""

    block: np.ndarray
    j0: np.ndarray
    j1: np.ndarray
    start: np.ndarray   # the block's first sample position

    @property
    def counts(self) -> np.ndarray:
        return self.j1 - self.j0

    def __len__(self) -> int:
        return len(self.block)


def offsets(counts: np.ndarray) -> np.ndarray:
    """First sample position of each block (int64, ``len(counts) + 1`` entries: the last is the total)."""
    return np.r_[0, np.cumsum(np.asarray(counts, dtype=np.int64))].astype(np.int64)


def rank_pieces(counts: np.ndarray, seed: int, rank: int = 0, world: int = 1, shuffle: bool = True) -> Pieces:
    """This rank's share of the blocks, fixed across epochs.

    The non-empty blocks are permuted by ``seed`` alone (natural order without shuffling), their windows laid end
    to end and cut into ``world`` runs of ``n // world`` or one more: rank r gets whole blocks and at most a part of
    one block at each end. Disjoint, complete, balanced to one window.
    """
    counts = np.asarray(counts, dtype=np.int64)
    off = offsets(counts)
    nz = np.flatnonzero(counts)
    order = nz[_perm(len(nz), seed, _ASSIGN)] if shuffle and world > 1 else nz
    c = counts[order]
    cum = offsets(c)
    n = int(cum[-1])
    q, rem = divmod(n, world)
    a = rank * q + min(rank, rem)
    b = a + q + (1 if rank < rem else 0)
    i0 = int(np.searchsorted(cum, a, "right")) - 1
    i1 = int(np.searchsorted(cum, b, "left"))
    i0 = max(i0, 0)
    blk = order[i0:i1]
    j0 = np.maximum(a - cum[i0:i1], 0)
    j1 = np.minimum(b - cum[i0:i1], c[i0:i1])
    keep = j1 > j0
    blk, j0, j1 = blk[keep], j0[keep], j1[keep]
    return Pieces(blk.astype(np.int64), j0.astype(np.int64), j1.astype(np.int64), off[blk])


def rank_total(n: int, rank: int, world: int) -> int:
    """Windows in rank's share before the tail rule (``n // world`` or one more): as many as the uniform order's."""
    return own_size(n, rank, world)


class RoundPlan:
    """One epoch of one rank in rounds (see the module docstring). O(pieces) memory.

    Args:
        pieces: the rank's share (:func:`rank_pieces`).
        seed, epoch, rank: what the order depends on (with the share).
        pool: K, the pieces live at a time.
        lifetime: L, the rounds a piece lives (its windows spread over them); ``pool // lifetime`` enter a round.
        shuffle: False: the pieces in their order, each one's windows in order (a sequential scan).
    """

    def __init__(self, pieces: Pieces, seed: int, epoch: int, rank: int, pool: int, lifetime: int = 8,
                 shuffle: bool = True) -> None:
        self.pieces, self.seed, self.epoch, self.rank, self.shuffle = pieces, seed, epoch, rank, shuffle
        p = len(pieces)
        self.pool = max(1, int(pool))
        lifetime = max(1, min(int(lifetime), self.pool))
        self.enter = max(1, self.pool // lifetime)
        self.order = _perm(p, seed, epoch, rank, _PIECES) if shuffle else np.arange(p, dtype=np.int64)
        c = pieces.counts[self.order]
        self.c = c
        if not shuffle:   # one piece per round, in order
            self.first = self.last = np.arange(p, dtype=np.int64)
            self.lifetime = 1
            self.enter = 1
        elif p <= self.pool:   # everything fits the pool: one round, a uniform shuffle of the rank's windows
            self.first = self.last = np.zeros(p, dtype=np.int64)
            self.lifetime = 1
        else:
            group = np.arange(p, dtype=np.int64) // self.enter
            last_group = int(group[-1])
            self.lifetime = min(lifetime, last_group + 1)
            rounds = max(1, last_group - self.lifetime + 2)
            self.first = np.maximum(0, group - self.lifetime + 1)
            self.last = np.minimum(group, rounds - 1)
        self.n_rounds = int(self.last[-1]) + 1 if p else 0
        span = self.last - self.first + 1
        self.span = span
        # Each piece's windows in a random affine order, (a * i + s) mod c with a coprime to c: which windows go
        # to which of its rounds (inside a round they are shuffled together anyway).
        if shuffle and p:
            rng = np.random.Generator(np.random.PCG64(_seed(seed, epoch, rank, _AFFINE)))
            cc = np.maximum(c, 1)
            a = rng.integers(0, 1 << 31, p) % cc
            a[a == 0] = 1
            s = rng.integers(0, 1 << 31, p) % cc
            for _ in range(64):
                bad = np.gcd(a, cc) != 1
                if not bad.any():
                    break
                a[bad] = a[bad] % cc[bad] + 1
            a[np.gcd(a, cc) != 1] = 1
            self.a, self.s = a, s
        else:
            self.a, self.s = np.ones(p, np.int64), np.zeros(p, np.int64)
        sizes = np.zeros(self.n_rounds, dtype=np.int64)
        for j in range(int(span.max()) if p else 0):
            live = span > j
            share = (c[live] * (j + 1)) // span[live] - (c[live] * j) // span[live]
            sizes += np.bincount(self.first[live] + j, weights=share, minlength=self.n_rounds).astype(np.int64)
        self.sizes = sizes
        self.cum = offsets(sizes)

    def __len__(self) -> int:
        return int(self.cum[-1])

    def live(self, r: int) -> np.ndarray:
        """Order positions of the pieces live in round r."""
        if not self.shuffle:
            return np.array([r], dtype=np.int64)
        lo = int(np.searchsorted(self.last, r, "left"))
        hi = int(np.searchsorted(self.first, r, "right"))
        return np.arange(lo, hi, dtype=np.int64)

    def blocks(self, r: int) -> np.ndarray:
        """Block ids live in round r."""
        if r < 0 or r >= self.n_rounds:
            return np.zeros(0, dtype=np.int64)
        return self.pieces.block[self.order[self.live(r)]]

    def round_of(self, position: int) -> tuple[int, int]:
        """``(round, offset inside it)`` of the rank's ``position``-th sample of the epoch."""
        r = int(np.searchsorted(self.cum, position, "right")) - 1
        return r, int(position - self.cum[r])

    def round_positions(self, r: int) -> np.ndarray:
        """Sample positions of round r, in the order they are delivered (int64)."""
        k = self.live(r)
        if len(k) == 0:
            return np.zeros(0, dtype=np.int64)
        c, span, j = self.c[k], self.span[k], r - self.first[k]
        lo, hi = (c * j) // span, (c * (j + 1)) // span
        n = hi - lo
        total = int(n.sum())
        # In place, a few bytes an entry: rounds hold millions of windows.
        rep = np.repeat(np.arange(len(k), dtype=np.int32), n)
        i = np.arange(total, dtype=np.int64)
        i -= np.repeat(np.cumsum(n) - n - lo, n)
        if self.shuffle:
            i *= np.take(self.a[k], rep)
            i += np.take(self.s[k], rep)
            i %= np.take(np.maximum(c, 1), rep)
        piece = self.order[k]
        i += np.take(self.pieces.start[piece] + self.pieces.j0[piece], rep)
        del rep
        if self.shuffle and total > 1:
            i = i[_perm(total, self.seed, self.epoch, self.rank, _ROUND, r)]
        return i


def epoch_positions(plan: RoundPlan, n: int, rank: int, world: int,
                    tail: Tail = "pad") -> np.ndarray:
    """The rank's whole epoch (every round, tail rule applied): for tests and small stores, O(windows)."""
    parts = [plan.round_positions(r) for r in range(plan.n_rounds)]
    pos = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return apply_tail(pos, n, rank, world, tail)


def apply_tail(pos: np.ndarray, n: int, rank: int, world: int, tail: Tail) -> np.ndarray:
    """Cut or extend the rank's positions to ``shard_size(n, world, tail)``."""
    want = shard_size(n, world, tail, rank)
    if len(pos) >= want:
        return pos[:want]
    return np.concatenate([pos, pad_positions(pos[:1], want - len(pos), n, rank)])


def pad_positions(first: np.ndarray, extra: int, n: int, rank: int) -> np.ndarray:
    """What pads a rank short of ``extra`` samples: its first window, or another rank's when it has none."""
    if extra <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    if len(first):
        return np.resize(first.astype(np.int64), extra)
    return (rank + np.arange(extra, dtype=np.int64)) % n


def group_segments(seg_counts: np.ndarray, per_block: int) -> np.ndarray:
    """Per-block counts from a ``[rows, segments]`` table: ``per_block`` consecutive segments of a row per block.

    Block ``b`` is row ``b // blocks_per_row``, segments ``(b % blocks_per_row) * per_block`` onward.
    """
    rows, segs = seg_counts.shape
    per_block = max(1, int(per_block))
    bpr = -(-segs // per_block) if segs else 0
    pad = bpr * per_block - segs
    t = np.pad(np.asarray(seg_counts, dtype=np.int64), ((0, 0), (0, pad)))
    return t.reshape(rows, bpr, per_block).sum(axis=2).reshape(-1)


def expected_distinct(pool: int, batch: int) -> float:
    """Expected distinct blocks among ``batch`` uniform draws from ``pool`` equal blocks: K (1 - e^(-b/K))."""
    return float(pool * -np.expm1(-batch / max(pool, 1)))


__all__ = ["Pieces", "RoundPlan", "apply_tail", "epoch_positions", "expected_distinct", "group_segments", "offsets",
           "pad_positions", "rank_pieces", "rank_total"]
