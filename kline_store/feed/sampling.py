"""Epoch order, rank shards, batches and resumption, as pure functions over index arrays.

The order of an epoch depends only on ``(n, seed, epoch, shuffle, rank, world_size, tail)``, never on worker
counts or timing, so every rank and every restart computes the same permutation independently:

    permutation(n, seed, epoch)             one shuffled copy of 0..n-1 per epoch
      -> shard(order, rank, world, tail)    this rank's part (interleaved: rank, rank + world, ...)
        -> batches(shard, batch_size, ...)  consecutive slices; a position (samples delivered) resumes them

Uneven tail (``n % world != 0``):

* ``tail="pad"`` (default, for training: every rank runs the same number of steps): the epoch's order is extended
  with its own first ``world - n % world`` entries, so each rank gets ``ceil(n / world)`` samples; every sample is
  covered, at most ``world - 1`` twice per epoch. The repeats are the last sample of some ranks' shards:
  ``padded(...)`` marks them (the loader's ``batch["padded"]``), so an evaluation can leave them out.
* ``tail="drop"``: the last ``n % world`` entries of the epoch's order are left out (different ones each epoch
  when shuffling); each rank gets ``n // world`` samples and no sample is seen twice.
* ``tail="uneven"`` (for evaluation): each rank gets its own ``order[rank::world]``, nothing repeated, nothing
  left out; ranks differ by at most one sample (so by at most one batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch

from ..errors import InputError
from ..system.indexes import index_dtype

TAILS = ("pad", "drop", "uneven")
Tail = Literal["pad", "drop", "uneven"]


def permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``0..n-1`` determined by ``(seed, epoch)`` alone (``index_dtype(n)``).

    ``torch.randperm`` with a generator seeded from ``(seed, epoch)``: a third of numpy's time for millions of
    windows (0.13 s for 5.4 M here), in 4-byte entries, and it releases the GIL. The same torch version gives the
    same order on every machine.
    """
    state = np.random.SeedSequence([int(seed) & (2**63 - 1), int(epoch)]).generate_state(1, np.uint64)[0]
    gen = torch.Generator().manual_seed(int(state) & (2**63 - 1))
    dtype = torch.int32 if index_dtype(n) == np.int32 else torch.int64
    return torch.randperm(n, generator=gen, dtype=dtype).numpy()


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The whole epoch's order (before sharding): a permutation, or ``arange(n)`` without shuffling."""
    return permutation(n, seed, epoch) if shuffle else np.arange(n, dtype=index_dtype(n))


def own_size(n: int, rank: int, world: int) -> int:
    """Samples of the epoch's order that are rank's own (``order[rank::world]``), before any padding or drop."""
    q, rem = divmod(n, world)
    return q + (1 if rank < rem else 0)


def shard_size(n: int, world: int, tail: Tail = "pad", rank: int = 0) -> int:
    """Samples rank ``rank`` gets per epoch (the same on every rank, except with ``tail="uneven"``)."""
    if tail == "uneven":
        return own_size(n, rank, world)
    return -(-n // world) if tail == "pad" else n // world


def padded(start: int, count: int, n: int, rank: int, world: int, tail: Tail = "pad") -> np.ndarray:
    """bool ``[count]``: which of the shard's samples ``start .. start + count - 1`` repeat one of another rank
    (``tail="pad"`` only: the positions past the rank's own samples)."""
    pos = np.arange(start, start + count, dtype=np.int64)
    return pos >= own_size(n, rank, world) if tail == "pad" else np.zeros(count, dtype=bool)


def shard(order: np.ndarray, rank: int, world: int, tail: Tail = "pad") -> np.ndarray:
    """This rank's part of an epoch's order (see the module docstring for ``tail``).

    Args:
        order: the epoch's order of all ``n`` samples.
        rank: this process's rank, ``0 <= rank < world``.
        world: number of ranks.
        tail: "pad", "drop" or "uneven".

    Returns:
        ``order[rank::world]`` of the padded or truncated order (a copy when ``world > 1``).
    """
    n = len(order)
    if world == 1:
        return order
    if tail == "uneven":
        pass
    elif tail == "pad":
        extra = shard_size(n, world, "pad") * world - n
        if extra:
            # a tail longer than n (n < world) wraps around as often as needed
            order = np.concatenate([order, np.resize(order, extra)])
    else:
        order = order[: (n // world) * world]
    return np.ascontiguousarray(order[rank::world])   # a copy: the whole epoch's order can be freed


def rank_indices(n: int, seed: int, epoch: int, rank: int = 0, world: int = 1, shuffle: bool = True,
                 tail: Tail = "pad") -> np.ndarray:
    """``(n, seed, epoch, rank, world) -> indices``: this rank's samples for the epoch, in order."""
    return shard(epoch_order(n, seed, epoch, shuffle), rank, world, tail)


def n_batches(n_samples: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches in a shard of ``n_samples``."""
    return n_samples // batch_size if drop_last else -(-n_samples // batch_size)


def batches(indices: np.ndarray, batch_size: int, drop_last: bool = False, position: int = 0
            ) -> Iterator[np.ndarray]:
    """Consecutive batches of ``indices`` starting at sample ``position`` (views, no copy).

    ``position`` is the number of samples already delivered; after a resume with a different batch size the
    batches restart at that sample.
    """
    end = n_batches(len(indices), batch_size, drop_last) * batch_size if drop_last else len(indices)
    for a in range(position, end, batch_size):
        yield indices[a: min(a + batch_size, end)]


def check_args(n: int, batch_size: int, rank: int, world: int, tail: str) -> None:
    """InputError for arguments no order can be made from."""
    if batch_size < 1:
        raise InputError(f"batch_size={batch_size}: must be >= 1")
    if world < 1 or not 0 <= rank < world:
        raise InputError(f"rank={rank}, world_size={world}: need world_size >= 1 and 0 <= rank < world_size")
    if tail not in TAILS:
        raise InputError(f"tail={tail!r}: expected one of {', '.join(TAILS)}")
    if n < 0:
        raise InputError(f"n={n}: must be >= 0")


class ResumableOrder:
    """What the orders of one rank share (:class:`EpochBatches`, the uniform order; ``BlockBatches``, the block
    order): the order's shape (samples, batch size, shuffle, seed, drop_last, rank, world size, tail), the position
    (epoch and samples delivered in it), and their state: ``state_dict`` and a checked ``load_state_dict``. The
    loader adds the store version to the state.

    The position counts samples *delivered* (the loader advances it as batches reach the user, not as workers
    prefetch them).
    """

    order = "uniform"
    resume_keys: tuple[str, ...] = ("n", "seed", "shuffle", "rank", "world_size", "tail")
    residency: Any = None        # the block order's read-ahead (None: nothing to read ahead or release)
    block_bytes = 0              # bytes per block, when the loader sized them (the block order's state records it)

    def __init__(self, n: int, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 rank: int = 0, world_size: int = 1, tail: Tail = "pad") -> None:
        check_args(n, batch_size, rank, world_size, tail)
        self.n, self.batch_size, self.shuffle, self.seed = n, int(batch_size), shuffle, seed
        self.drop_last, self.rank, self.world_size, self.tail = drop_last, rank, world_size, tail
        self.epoch = 0
        self.position = 0
        k = shard_size(n, world_size, tail, rank)
        self._per_epoch = (k // self.batch_size) * self.batch_size if drop_last else k

    def samples_per_epoch(self) -> int:
        """Samples this rank delivers per epoch (after drop_last)."""
        return self._per_epoch

    def __len__(self) -> int:
        """Batches per full epoch on this rank."""
        return n_batches(shard_size(self.n, self.world_size, self.tail, self.rank), self.batch_size, self.drop_last)

    def remaining(self) -> int:
        """Batches left in the current epoch."""
        left = self.samples_per_epoch() - self.position
        return max(0, -(-left // self.batch_size))

    # progress ------------------------------------------------------------
    def advance(self, n_samples: int) -> None:
        """Record ``n_samples`` delivered; the epoch rolls over to the next one when it is complete."""
        self.position += n_samples
        if self.position >= self._per_epoch:
            self.epoch += 1
            self.position = 0

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` (position 0); the current epoch keeps its position, so a resumed run may call it."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.position = 0

    # state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain dict: ``epoch``, ``position`` (samples delivered this epoch), ``seed`` and the order's shape."""
        return {"epoch": self.epoch, "seed": self.seed, "position": self.position, "n": self.n,
                "shuffle": self.shuffle, "rank": self.rank, "world_size": self.world_size, "tail": self.tail,
                "batch_size": self.batch_size, "drop_last": self.drop_last}

    def _other_order(self, state: dict[str, Any]) -> str | None:
        """The error line when ``state`` is of another order, else None."""
        theirs = state.get("order", "uniform")
        if theirs == self.order:
            return None
        return (f"loader state is of order={theirs!r}; this loader has order={self.order!r}: it would resume a "
                f"different order; create the loader with order={theirs!r}")

    def _differs(self, key: str, value: Any) -> bool:
        return value != getattr(self, key)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; InputError when it describes a different order.

        The batch size may differ: the next batch starts at the saved sample position.
        """
        if not isinstance(state, dict):
            raise InputError(f"loader state is a {type(state).__name__}; expected a dict from state_dict()")
        other = self._other_order(state)
        if other:
            raise InputError(other)
        missing = [k for k in ("epoch", "position") if k not in state]
        if missing:
            raise InputError(f"loader state lacks {', '.join(missing)}; expected a dict from state_dict()")
        for key in ("epoch", "position"):
            v = state[key]
            whole = isinstance(v, (int, np.integer)) and not isinstance(v, bool) or \
                isinstance(v, (float, np.floating)) and np.isfinite(v) and v == int(v)
            if not whole or v < 0 or v > 1 << 62:
                raise InputError(f"loader state has {key}={v!r}; expected a whole number >= 0 from state_dict()")
        for key in self.resume_keys:
            if key in state and self._differs(key, state[key]):
                raise InputError(f"loader state has {key}={state[key]!r} but this loader has "
                                 f"{key}={getattr(self, key)!r}: it would resume a different order; create the "
                                 f"loader with the same dataset and arguments")
        position = int(state["position"])
        if not 0 <= position <= shard_size(self.n, self.world_size, self.tail, self.rank):
            raise InputError(f"loader state position={position} is outside the epoch")
        self.epoch = int(state["epoch"])
        self.position = position


class EpochBatches(ResumableOrder):
    """The index batches of one rank in the uniform order, epoch after epoch, with a resumable position.

    A small stateful wrapper around the pure functions above: it caches the current epoch's shard (its position
    and state: :class:`ResumableOrder`). Iterating yields the remaining batches of the current epoch without
    advancing; see :meth:`advance`.

    Args:
        n: number of samples (valid windows, or days for cross-sections).
        batch_size: samples per batch.
        shuffle: shuffle each epoch (else the natural order).
        seed: base seed of the permutation.
        drop_last: drop this rank's last, incomplete batch.
        rank: this process's rank.
        world_size: number of ranks.
        tail: how an uneven split over ranks is handled ("pad", "drop" or "uneven").
    """

    def __init__(self, n: int, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 rank: int = 0, world_size: int = 1, tail: Tail = "pad") -> None:
        super().__init__(n, batch_size, shuffle, seed, drop_last, rank, world_size, tail)
        self._cache: tuple[int, np.ndarray] | None = None

    # order -------------------------------------------------------------
    def indices(self) -> np.ndarray:
        """This rank's samples of the current epoch (cached)."""
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self.indices_for(self.epoch))
        return self._cache[1]

    def indices_for(self, epoch: int) -> np.ndarray:
        """This rank's samples of any epoch (computed, not cached: a loader may compute the next one ahead)."""
        return rank_indices(self.n, self.seed, epoch, self.rank, self.world_size, self.shuffle, self.tail)

    def provide(self, epoch: int, indices: np.ndarray) -> None:
        """Install an epoch's order computed ahead by :meth:`indices_for` (used once that epoch is current)."""
        self._cache = (int(epoch), indices)

    def __iter__(self) -> Iterator[np.ndarray]:
        """The remaining batches of the current epoch, from ``position``; does not advance ``position``."""
        return batches(self.indices(), self.batch_size, self.drop_last, self.position)
