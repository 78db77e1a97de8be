"""The block order in a loader: which order a loader takes (``order="auto"``), the resumable block sampler, and the
residency of its blocks (read ahead a round early, released a round late, in a background thread).

A source takes the block order when its ``block_order_ok`` is true; it is then a
:class:`~kline_store.feed.source.BlockOrderSource` (``block_segments() -> (counts [rows, segments], segment
bytes)``, ``prefetch_segments``, ``release_segments``, ``block_defaults``, ...): KlineDataset with calendar windows
(a block: a run of one symbol row's windows), CrossSectionDataset (one row of segments of dates; a block: a run of
days across the symbols).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, cast

import numpy as np

from ..errors import InputError
from ..system.background import stopping, track
from .block_order import Pieces, RoundPlan, group_segments, pad_positions, rank_pieces
from ..system.cores import local_world_size
from ..system.ranks import first_rank_decides
from ..memory import Available, available, gib, require
from .source import MAX_BLOCK_BYTES, BatchSource, BlockOrderSource, default_pool  # noqa: F401  (their old home)
from .sampling import EpochBatches, ResumableOrder, Tail, check_args
from ..system.indexes import index_dtype

ORDERS = ("auto", "uniform", "blocks")
AUTO_FRACTION = 0.5        # "auto" takes the block order when samples read more than this share of the memory
POOL_FRACTION = 0.25       # the pool of live blocks may fill this share of the memory (page cache)
LIFETIME = 8               # rounds a block lives: K / LIFETIME blocks enter and leave per round


def supports_blocks(source: BatchSource) -> bool:
    return bool(source.block_order_ok)


def choose_order(source: BatchSource, requested: str, avail: Available | None = None) -> str:
    """"uniform" or "blocks" for ``order=requested``: auto takes blocks when the bytes samples read exceed
    ``AUTO_FRACTION`` of the available memory (or when the source keeps no per-window index)."""
    if requested not in ORDERS:
        raise InputError(f"order={requested!r}: expected one of {', '.join(ORDERS)}")
    if requested == "blocks" and not supports_blocks(source):
        raise InputError(f"order='blocks' needs a dataset of calendar windows (KlineDataset or CrossSectionDataset, "
                         f"days='calendar'); {type(source).__name__} supports order='uniform'")
    if requested != "auto":
        return requested
    if not supports_blocks(source):
        return "uniform"
    if not source.keeps_full_index:
        return "blocks"
    avail = available() if avail is None else avail
    return "blocks" if cast(BlockOrderSource, source).read_bytes() > avail.nbytes * AUTO_FRACTION else "uniform"


def check_uniform(source: BatchSource, n: int, avail: Available | None = None) -> None:
    """One-line InputError when the uniform order does not fit: the epoch order (two of them: the next one is
    computed ahead) and, for a dataset that kept only the block index, the full index."""
    item = index_dtype(n).itemsize
    need = 2 * n * item
    extra = ""
    if not source.keeps_full_index:
        need += int(cast(BlockOrderSource, source).full_index_bytes())
        extra = " and the valid-window index"
    if need == 0:
        return
    require(f"order='uniform' over {n:,} windows (two epoch orders{extra})", need, avail,
            hint="use order='blocks' (memory per block, not per window)")


class BlockBatches(ResumableOrder):
    """The block order of one rank, epoch after epoch, with a resumable position (its position and state:
    :class:`~kline_store.feed.sampling.ResumableOrder`, as for EpochBatches).

    Args:
        counts: valid windows per block (block ``b``'s samples follow block ``b - 1``'s).
        batch_size, shuffle, seed, drop_last, rank, world_size, tail: as for EpochBatches.
        pool: K, blocks live at a time; lifetime: rounds each lives.
        residency: called with ``(plan, round)`` as each round starts (read ahead, release), or None.
    """

    streaming = True
    order = "blocks"
    resume_keys = ResumableOrder.resume_keys + ("pool", "lifetime", "block_bytes", "n_blocks")

    def __init__(self, counts: np.ndarray, batch_size: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, rank: int = 0, world_size: int = 1, tail: Tail = "pad",
                 pool: int = 1024, lifetime: int = LIFETIME, residency: Any = None) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        n = int(counts.sum())
        check_args(n, batch_size, rank, world_size, tail)
        if pool < 1 or lifetime < 1:
            raise InputError(f"pool_blocks={pool}, lifetime={lifetime}: must be >= 1")
        super().__init__(n, batch_size, shuffle, seed, drop_last, rank, world_size, tail)
        self.pool, self.lifetime, self.n_blocks = int(pool), int(lifetime), len(counts)
        self.residency = residency
        self.block_bytes = 0          # bars per block, when the loader sized them (its state records them)
        self.pieces: Pieces = rank_pieces(counts, seed, rank, world_size, shuffle)
        self._cache: tuple[int, RoundPlan] | None = None

    # order --------------------------------------------------------------------------
    def plan(self) -> RoundPlan:
        """The current epoch's round plan (cached)."""
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self.indices_for(self.epoch))
        return self._cache[1]

    def indices_for(self, epoch: int) -> RoundPlan:   # what OrderAhead computes ahead: O(blocks)
        return RoundPlan(self.pieces, self.seed, epoch, self.rank, self.pool, self.lifetime, self.shuffle)

    def provide(self, epoch: int, plan: RoundPlan) -> None:
        self._cache = (int(epoch), plan)

    def indices(self) -> np.ndarray:
        """The whole epoch's positions (O(windows): for tests and small stores; the loader streams them)."""
        parts = list(self._stream(self.plan(), 0, notify=False))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._batches(self.plan(), self.position)

    def _stream(self, plan: RoundPlan, position: int, notify: bool = True) -> Iterator[np.ndarray]:
        """Positions from ``position`` to the end of the epoch, a round (or part of one) at a time."""
        end, own = self._per_epoch, len(plan)
        cur = position
        if cur < min(own, end):
            r, off = plan.round_of(cur)
            ahead = RoundsAhead(plan)
            while cur < min(own, end):
                if notify and self.residency is not None:
                    self.residency(plan, r)
                arr = ahead.take(r)[off: off + min(own, end) - cur]
                cur += len(arr)
                r, off = r + 1, 0
                if len(arr):
                    yield arr
        if notify and self.residency is not None:
            self.residency(plan, plan.n_rounds)   # the epoch is out: release what is left
        if end > max(cur, own):
            first = plan.round_positions(0)[:1] if own else np.zeros(0, np.int64)
            pad = pad_positions(first, end - own, self.n, self.rank)
            yield pad[max(0, cur - own):]

    def _batches(self, plan: RoundPlan, position: int) -> Iterator[np.ndarray]:
        b = self.batch_size
        carry = np.zeros(0, np.int64)
        for arr in self._stream(plan, position):
            if len(carry):
                arr = np.concatenate([carry, arr])
            full = len(arr) // b * b
            for a in range(0, full, b):
                yield arr[a: a + b]
            carry = arr[full:]
        if len(carry):
            yield carry

    # state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "order": "blocks", "pool": self.pool, "lifetime": self.lifetime,
                "n_blocks": self.n_blocks, "block_bytes": self.block_bytes}

    def _differs(self, key: str, value: Any) -> bool:
        # blocks sized from the available memory take the saved size (the loader makes them again)
        return super()._differs(key, value) and (key != "block_bytes" or bool(self.block_bytes))


class RoundsAhead:
    """Round positions of a plan, the next round computed in a background thread while this one is delivered: a
    round's shuffle (hundreds of thousands of positions; numpy and torch release the GIL) then overlaps the gathers
    instead of holding up the thread that asked for the next chunk."""

    def __init__(self, plan: RoundPlan) -> None:
        self.plan = plan
        self._job: tuple[int, threading.Thread, list[np.ndarray]] | None = None

    def take(self, r: int) -> np.ndarray:
        job, self._job = self._job, None
        if job is not None and job[0] == r:
            job[1].join()
            arr = job[2][0] if job[2] else self.plan.round_positions(r)
        else:
            arr = self.plan.round_positions(r)
        if r + 1 < self.plan.n_rounds and not stopping.is_set():
            box: list[np.ndarray] = []
            th = track(threading.Thread(target=lambda: box.append(self.plan.round_positions(r + 1)),
                                        name="kline-round", daemon=True))
            th.start()
            self._job = (r + 1, th, box)
        return arr


class Residency:
    """Keeps the blocks of the current and next round resident and releases the others, in a background thread:
    rounds hold hundreds of thousands of windows, so a round of notice is far more than the gathers run ahead.

    Correctness never depends on it: a window whose block is not resident is read (and its validity computed)
    on demand; only speed does.
    """

    def __init__(self, source: BlockOrderSource, blocks_per_row: int, per_block: int, n_segments: int) -> None:
        self.source, self.bpr, self.per_block, self.n_segments = source, blocks_per_row, per_block, n_segments
        self.loaded: set[int] = set()
        self._q: queue.Queue[tuple[str, list[int]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def _segments(self, b: int) -> tuple[int, int, int]:
        row, k = divmod(int(b), self.bpr)
        k0 = k * self.per_block
        return row, k0, min(self.n_segments, k0 + self.per_block)

    def __call__(self, plan: RoundPlan, r: int) -> None:
        want = set(plan.blocks(r).tolist()) | set(plan.blocks(r + 1).tolist())
        keep = want | set(plan.blocks(r - 1).tolist())
        drop = sorted(self.loaded - keep)
        load = [b for b in plan.blocks(r).tolist() + plan.blocks(r + 1).tolist() if b not in self.loaded]
        now = [b for b in dict.fromkeys(plan.blocks(r).tolist()) if b not in self.loaded]
        self.loaded = (self.loaded - set(drop)) | set(load)
        if drop:
            self._put(("release", drop))
        if now:   # the epoch's first round, or a resume: read in large requests now, not as 4 KiB faults later
            self._apply("prefetch", now)
        later = [b for b in dict.fromkeys(load) if b not in set(now)]
        if later:
            self._put(("prefetch", later))

    def _put(self, job: tuple[str, list[int]]) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = track(threading.Thread(target=self._run, name="kline-blocks", daemon=True))
            self._thread.start()
        self._q.put(job)

    def _run(self) -> None:
        while not stopping.is_set():
            try:
                job = self._q.get(timeout=1.0)
            except queue.Empty:
                return
            if job is None:
                return
            if not self._apply(*job):
                return

    def _apply(self, kind: str, blocks: list[int]) -> bool:
        fn = self.source.prefetch_segments if kind == "prefetch" else self.source.release_segments
        for b in blocks:
            if stopping.is_set():
                return False
            try:
                fn(*self._segments(b))
            except Exception:   # advice only: a failure costs speed, never a wrong batch
                pass
        return True

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._q.put(None)


def check_loader_memory(order: str, sampler: ResumableOrder, chunk_bytes: int, slots: int, avail: Available | None = None,
                        processes: bool = False) -> None:
    """One-line InputError when the loader's chunk buffers (and the block order's pool of resident blocks) need
    more than the available memory: under a cgroup limit the alternative is the OOM killer, or a process that
    thrashes its page cache without end. Worker processes are handed the epoch's chunks as one list (8 bytes a
    window in the block order, on top of its state)."""
    need = chunk_bytes * slots
    what = f"the loader's {slots} chunk buffers of {gib(chunk_bytes)}"
    if processes and order == "blocks":
        need += 8 * sampler.samples_per_epoch()
        what += " and the epoch's chunks listed for worker processes"
    if order == "blocks":
        resident = sampler.pool + max(1, sampler.pool // LIFETIME)
        need += resident * int(sampler.block_bytes)
        what += f" and its {resident:,} resident blocks"
    require(what, need, avail, hint="use fewer num_workers, a smaller prefetch_factor or batch_size"
            + (", or a smaller pool_blocks=" if order == "blocks" else "")
            + (", or backend='threads'" if processes and order == "blocks" else ""))


def agreed_blocks(name: str, per_block: int) -> int:
    """Segments per block every rank of the default process group takes (:func:`first_rank_decides`). Each rank
    sizes blocks from its own available memory, which differs between nodes and from moment to moment; blocks cut
    differently would make the ranks' shares overlap."""
    agreed = first_rank_decides(name, per_block)
    return per_block if agreed is None else agreed


def make_sampler(source: BatchSource, order: str, batch_size: int, shuffle: bool, seed: int, drop_last: bool, rank: int,
                 world_size: int, tail: Tail, pool_blocks: int | None = None,
                 block_bytes: int | None = None) -> tuple[EpochBatches | BlockBatches, str]:
    """The loader's sampler for ``order`` ("auto", "uniform", "blocks"), and the order taken. Without
    ``block_bytes``, blocks are sized from the available memory, the same on every rank (:func:`agreed_blocks`);
    the sampler's state records their size, and a loader resumed from it takes that size again."""
    avail = available()
    order = choose_order(source, order, avail)   # the page cache is one for the machine's ranks
    local = local_world_size()                   # what each rank holds is its own: its share of the memory
    if local > 1:
        avail = Available(avail.nbytes // local, f"{avail.source}, shared by {local} local ranks")
    if order == "uniform":
        n = len(source)
        check_uniform(source, n, avail)
        if not source.keeps_full_index:
            cast(BlockOrderSource, source).full_index()
        return EpochBatches(n, batch_size, shuffle, seed, drop_last, rank, world_size, tail), order
    blocks = cast(BlockOrderSource, source)   # choose_order took "blocks": its block_order_ok said so
    seg_counts, seg_bytes = blocks.block_segments()
    own_pool, max_block = blocks.block_defaults(batch_size)
    pool = own_pool if pool_blocks is None else int(pool_blocks)
    resident = pool + max(1, pool // LIFETIME)   # blocks live at once, and the next round's entering ones
    if block_bytes is None:
        budget = avail.nbytes * POOL_FRACTION
        per_block = max(1, int(min(max_block, max(seg_bytes, budget // max(1, resident)))) // seg_bytes)
        per_block = agreed_blocks(f"kline-store/blocks/{type(source).__name__}/{seg_counts.shape}/{seg_bytes}/"
                                  f"{pool}", per_block)
    else:
        per_block = max(1, int(block_bytes) // seg_bytes)
    require(f"order='blocks' with a pool of {pool:,} blocks of {gib(per_block * seg_bytes)}",
            resident * per_block * seg_bytes, avail, POOL_FRACTION * 2,
            hint="pass a smaller pool_blocks= or block_bytes=")
    counts = group_segments(seg_counts, per_block)
    n_segments = seg_counts.shape[1]
    bpr = -(-n_segments // per_block) if n_segments else 0
    residency = Residency(blocks, bpr, per_block, n_segments)
    sampler = BlockBatches(counts, batch_size, shuffle, seed, drop_last, rank, world_size, tail, pool,
                           LIFETIME, residency)
    sampler.block_bytes = per_block * seg_bytes
    return sampler, order


__all__ = ["AUTO_FRACTION", "BlockBatches", "ORDERS", "Residency", "RoundsAhead", "agreed_blocks",
           "check_loader_memory", "check_uniform", "choose_order", "default_pool", "make_sampler", "supports_blocks"]
