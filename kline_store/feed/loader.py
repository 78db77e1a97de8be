"""KlineLoader: the order of an epoch (``sampling.py``), gathered a chunk of batches at a time, delivered as batches.

    index batches (seed, epoch, rank, world)
      -> chunks of consecutive batches (1, 2, 4, ... then ~CHUNK_BYTES): the fixed cost of a gather call is paid
         once per chunk, and batches are views of the chunk
      -> host stage: gathered in the training thread (num_workers=0), in threads that release the GIL (the
         default: as many as this rank's share of the cores), or in worker processes (backend="processes",
         through a shared-memory ring); into reused buffers (recycled CPU buffers, or pinned ring slots for a GPU)
      -> device stage (device="cuda"): side-stream copies one chunk ahead, or a GPU-resident panel
      -> batches, in order; the position advances when a batch is handed out, never when it is prefetched

The order depends only on ``(seed, epoch, rank, world_size)``: workers, threads and chunking never change it, and
``state_dict()`` taken mid-epoch resumes exactly at the next batch.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from .batches import map_tensors, slices
from .buffers import HostRing, Layout, Recycler, pinned_alloc
from .config import device_kind, resolve_config
from .device import HostItem, cuda_stage, resident_stream
from ..errors import InputError
from .placement import PLACEMENTS, background_priority, choose_placement, device_free_bytes, host_available_bytes, usable_cores
from .background import track
from .prefetch import KeepTorchThreads, OrderedPrefetcher, SingleThreaded, single_threaded_torch
from .sampling import EpochBatches
from .workers import ChunkFetch, ProcessPool

# Bytes gathered per host call (several batches): the fixed cost of a gather call (Python, index arithmetic, a
# dozen small kernels) is paid once per chunk instead of once per batch.
CHUNK_BYTES = 8 << 20

Batch = dict[str, torch.Tensor]
Chunk = tuple[np.ndarray, list[int]]

# DataLoader keywords accepted for familiarity (the classic recipe passes them as they are).
_DATALOADER_KWARGS = ("prefetch_factor", "pin_memory", "persistent_workers", "collate_fn", "worker_init_fn",
                      "multiprocessing_context", "timeout", "in_order", "pin_memory_device")


class BatchSource(Protocol):
    """What the loader needs from a dataset (KlineDataset, CrossSectionDataset)."""

    path: Path

    def __len__(self) -> int: ...

    @property
    def window(self) -> int: ...

    @property
    def batch_layout(self) -> Layout | None:
        """Shape and dtype of one sample per key, when all samples have one shape (chunks, reusable buffers);
        None when each batch has its own shape (padded cross-sections): then one batch per gather."""
        ...

    def gather_batch(self, indices: np.ndarray, out: Batch | None = None) -> Batch: ...

    def resident(self, device: torch.device, pin: bool = False) -> Callable[[torch.Tensor], Batch]:
        """Copy what samples read to ``device`` once; returns ``gather(positions) -> batch`` running there."""
        ...

    def resident_nbytes(self) -> int: ...


def dist_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed's when it is initialised, else ``(0, 1)``."""
    if (rank is None or world_size is None) and torch.distributed.is_available() \
            and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank() if rank is None else rank
        world_size = torch.distributed.get_world_size() if world_size is None else world_size
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


def chunk_plan(batches: Iterable[np.ndarray], per_chunk: int) -> Iterator[Chunk]:
    """Group consecutive index batches into chunks of up to ``per_chunk`` batches.

    The first chunks of a pass are small (1, 2, 4, ... batches) so the first batch arrives after one batch's
    gather, not a whole chunk's.
    """
    want = 1
    group: list[np.ndarray] = []
    for b in batches:
        group.append(b)
        if len(group) == want:
            yield (group[0] if want == 1 else np.concatenate(group)), [len(g) for g in group]
            group = []
            want = min(per_chunk, 2 * want)
    if group:
        yield np.concatenate(group), [len(g) for g in group]


class _OrderAhead:
    """Epoch orders computed in a background thread before they are needed.

    Shuffling millions of windows takes a noticeable fraction of a second (numpy releases the GIL meanwhile): the
    first epoch's order is started when the loader is made, each next one when an epoch starts, at the lowest
    scheduling priority so that it takes only what the gathers leave.
    """

    def __init__(self, sampler: EpochBatches) -> None:
        self.sampler = sampler
        self._jobs: dict[int, tuple[threading.Thread, list[np.ndarray]]] = {}

    def start(self, epoch: int) -> None:
        if epoch in self._jobs or not self.sampler.shuffle:
            return
        for stale in [e for e in self._jobs if e < epoch - 1]:
            del self._jobs[stale]
        box: list[np.ndarray] = []

        def compute() -> None:
            background_priority()   # idle cores only: never slows the gathers of the epoch being delivered
            box.append(self.sampler.indices_for(epoch))

        th = track(threading.Thread(target=compute, name="kline-order", daemon=True))   # joined at exit
        th.start()
        self._jobs[epoch] = (th, box)

    def install(self, epoch: int) -> None:
        job = self._jobs.pop(epoch, None)
        if job is not None:
            job[0].join()
            if job[1]:
                self.sampler.provide(epoch, job[1][0])


class _ChunkBuffer:
    """The buffer one chunk is gathered into, taken by whichever of its parts runs first.

    Parts finish in any order across threads; the loader delivers the chunk with the part that completes it.
    """

    def __init__(self, n: int, parts: int, recycler: Recycler | None, ring: HostRing | None) -> None:
        self.n, self.expected, self.recycler, self.ring = n, parts, recycler, ring
        self.out: Batch | None = None
        self.slot: tuple[HostRing, int] | None = None
        self.done = 0
        self._lock = threading.Lock()

    def get(self) -> Batch | None:
        with self._lock:
            if self.out is None:
                if self.recycler is not None:
                    self.out = self.recycler.take(self.n)
                elif self.ring is not None:
                    k = self.ring.acquire()
                    self.slot = (self.ring, k)
                    self.out = {key: t[: self.n] for key, t in self.ring.buffers[k].items()}
            return self.out

    def part_done(self) -> bool:
        """Count a finished part; True for the one that completes the chunk."""
        with self._lock:
            self.done += 1
            return self.done == self.expected

    def release(self) -> None:
        if self.slot is not None:
            self.slot[0].release(self.slot[1])


class KlineLoader:
    """Deterministic, resumable, DDP-sharded batch loader that keeps up with the hardware.

    Args:
        source: a KlineDataset or CrossSectionDataset (see :class:`BatchSource`).
        batch_size: samples per batch.
        shuffle: a new permutation each epoch (else the index order).
        seed: base seed; the order depends only on (seed, epoch, rank, world_size).
        drop_last: drop this rank's last incomplete batch.
        num_workers: gather threads (default: this process's share of the cores), or worker processes with
            ``backend="processes"``; 0 gathers in the training thread. More threads than cores are not started
            (they cannot gather faster).
        rank: this rank (default: torch.distributed's, else 0).
        world_size: number of ranks (default: torch.distributed's, else 1).
        tail: uneven split over ranks: "pad" (repeat the first samples of the epoch's order so every rank gets
            ceil(n / world) samples; all samples covered) or "drop" (leave the last n % world out this epoch).
        device: where batches are delivered: None/"cpu", "cuda", "cuda:1", a torch.device.
        placement: "auto" (on CUDA: the panel on the GPU when it fits, else pinned host memory, else the memmap;
            on the CPU: the memmap), or "device", "pinned", "memmap" to force one. "device" on the CPU is a private
            RAM copy of the fields and days samples use.
        config: "auto" (the configuration `kline-store tune` saved for this store, window, batch size, device and
            core count), a dict, a tune JSON file, or None (defaults). Explicit arguments override it.
        backend: "threads" (default) or "processes" (DataLoader worker processes: for a per-batch ``collate_fn``
            that holds the GIL).
        prefetch_factor: chunks in flight per worker (default 2).
        pin_memory: pinned staging buffers (default: on for CUDA; meaningless without it).
        persistent_workers: keep worker processes between epochs (default True).
        collate_fn: applied to each batch dict before it is delivered (in the workers when there are some).
        worker_init_fn, multiprocessing_context, timeout: as for ``DataLoader`` (worker processes only).
        in_order: must be True (the order must not depend on timing).
        pin_memory_device: accepted and ignored (the device is ``device``).

    Attributes:
        batch_sampler: the :class:`~kline_store.feed.sampling.EpochBatches` holding order and position.
        device, placement, config: what was resolved (``config_source``: "default", "tuned" or "given").
    """

    def __init__(self, source: BatchSource, batch_size: int = 256, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_workers: int | None = None, *, rank: int | None = None,
                 world_size: int | None = None, tail: Literal["pad", "drop"] = "pad", device: Any = None,
                 placement: str = "auto", config: Any = None, backend: str | None = None,
                 **dataloader_kwargs: Any) -> None:
        unknown = sorted(set(dataloader_kwargs) - set(_DATALOADER_KWARGS))
        if unknown:
            hint = (" (the loader makes its own batches from batch_size, shuffle, seed and drop_last)"
                    if set(unknown) & {"sampler", "batch_sampler", "generator"} else "")
            raise InputError(f"loader(): unknown argument(s) {', '.join(unknown)}{hint}")
        kw = dataloader_kwargs
        if kw.get("in_order", True) is False:
            raise InputError("loader(in_order=False): batches would arrive in worker timing order; the loader's "
                             "order must depend only on (seed, epoch, rank, world_size)")
        rank, world_size = dist_rank_world(rank, world_size)
        self.source = source
        self.batch_size = int(batch_size)
        self.batch_sampler = EpochBatches(len(source), self.batch_size, shuffle, seed, drop_last, rank, world_size,
                                          tail)
        self._orders = _OrderAhead(self.batch_sampler)
        self._orders.start(self.batch_sampler.epoch)
        self.device = self._check_device(device)
        cuda = self.device.type == "cuda"
        cfg, self.config_source = resolve_config(config, source.path, source.window, self.batch_size, self.device)
        explicit = {"backend": backend, "num_workers": num_workers, "prefetch": kw.get("prefetch_factor"),
                    "pin_memory": kw.get("pin_memory")}
        cfg.update({k: v for k, v in explicit.items() if v is not None})
        if any(v is not None for v in explicit.values()):
            cfg, _ = resolve_config(cfg, source.path, source.window, self.batch_size, self.device)
        self.config = cfg
        self.collate_fn = kw.get("collate_fn")
        self._worker_options = {k: kw[k] for k in ("worker_init_fn", "multiprocessing_context", "timeout")
                                if kw.get(k) is not None}
        self._persistent = kw.get("persistent_workers")
        self.layout = source.batch_layout
        if placement not in PLACEMENTS:
            raise InputError(f"placement must be one of {', '.join(PLACEMENTS)}; got {placement!r}")
        if placement in ("device", "pinned") and self.layout is None:
            raise InputError(f"placement={placement!r} needs a dataset with a panel copy (KlineDataset); "
                             f"{type(source).__name__} supports placement='memmap'")
        nbytes = source.resident_nbytes() if cuda and placement == "auto" and self.layout is not None else 0
        self.placement = choose_placement(nbytes, cuda=cuda, requested=placement,
                                          device_free=device_free_bytes(self.device) if nbytes else None,
                                          host_available=host_available_bytes() if nbytes else None)
        self._gather: Callable[..., Batch] | None = None
        self._recycler: Recycler | None = None
        self._ring: HostRing | None = None
        self._ring_key: tuple[int, int] | None = None
        self._passes = 0
        self._pool: ProcessPool | None = None
        self._sync: SingleThreaded | None = None

    @staticmethod
    def _check_device(device: Any) -> torch.device:
        dev = torch.device(device if device is not None else "cpu")
        if dev.type not in ("cpu", "cuda"):
            raise InputError(f"device must be 'cpu' or a CUDA device; got {str(dev)!r}")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise InputError(f"device {str(dev)!r} requested but CUDA is not available; use device='cpu'")
        return dev

    # -- what gathers ---------------------------------------------------------------
    @property
    def num_workers(self) -> int:
        """Gather threads or worker processes in use (0: in the training thread)."""
        n = self.config["num_workers"]
        return min(n, usable_cores()) if self.config["backend"] == "threads" else n

    @property
    def backend(self) -> str:
        return self.config["backend"]

    def gather_fn(self) -> Callable[..., Batch]:
        """The batch gather of this placement (a resident copy is made on first use and kept)."""
        if self._gather is None:
            if self.placement == "memmap":
                self._gather = self.source.gather_batch
            elif self.placement == "pinned":
                self._gather = self.source.resident(torch.device("cpu"), pin=True)
            else:  # "device": the GPU, or RAM when the device is the CPU
                self._gather = self.source.resident(self.device)
        return self._gather

    def _batches_per_chunk(self) -> int:
        if self.layout is None:
            return 1
        sample = sum(int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dt).element_size()
                     for shape, dt in self.layout.values())
        return max(1, CHUNK_BYTES // max(1, sample * self.batch_size))

    # -- iteration ------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        sampler = self.batch_sampler
        started = sampler.epoch
        self._orders.install(started)
        self._orders.start(started + 1)
        stream = self._stream(iter(sampler))
        try:
            for batch, n in stream:
                sampler.advance(n)  # before handing it out: a state_dict taken now includes it
                yield batch
        finally:
            stream.close()
        if sampler.epoch == started:  # nothing left in this epoch (empty shard, or a resumed end): next one
            sampler.set_epoch(started + 1)

    def _stream(self, batches: Iterator[np.ndarray]) -> Iterator[tuple[Any, int]]:
        chunks = chunk_plan(batches, self._batches_per_chunk())
        cuda = self.device.type == "cuda"
        if self.placement == "device" and cuda:
            stream = resident_stream(self.gather_fn(), list(chunks), self.device)
            yield from self._collated(stream)
            return
        pin = cuda and self.config["pin_memory"]
        if self.backend == "processes" and self.num_workers > 0 and self.placement == "memmap":
            host = self._host_processes(list(chunks))
        else:
            host = self._host_threads(chunks, pin)
        if cuda:
            yield from cuda_stage(self._ready_split(host), self.device)
            return
        for data, sizes, slot in host:
            if slot == "ready":
                yield from zip(data, sizes)
            else:
                yield from slices(data, sizes)

    def _collated(self, stream: Iterable[tuple[Any, int]]) -> Iterator[tuple[Any, int]]:
        """The collate function on device batches (a GPU-resident panel has no host stage to run it in)."""
        fn = self.collate_fn
        if fn is None:
            yield from stream
        else:
            for batch, n in stream:
                yield fn(batch), n

    @staticmethod
    def _ready_split(host: Iterable[tuple[Any, list[int], Any]]) -> Iterator[HostItem]:
        """Batches a worker already transformed travel to the GPU one by one; chunks as they are."""
        for data, sizes, slot in host:
            if slot == "ready":
                for b, n in zip(data, sizes):
                    yield b, [n], None
            else:
                yield data, sizes, slot

    # -- host stages ----------------------------------------------------------------
    def _host_threads(self, chunks: Iterator[Chunk], pin: bool) -> Iterator[tuple[Any, list[int], Any]]:
        gather = self.gather_fn()
        capacity = self._batches_per_chunk() * self.batch_size
        n_threads = self.num_workers
        depth = max(1, self.config["prefetch"]) * max(1, n_threads)
        fixed = self.layout is not None
        # Buffers: `depth` chunks being gathered or waiting, the one the consumer cuts, and one whose last batch
        # the training step may still hold (the recycler takes fresh memory beyond that, never a busy slot).
        ring = self._make_ring(depth + 2, capacity) if pin and fixed else None
        recycler = self._make_recycler(depth + 2, capacity) if fixed and not pin else None
        # A per-batch transform runs on the host batches, in the gather threads (the training thread without them).
        split = self.collate_fn
        # With several threads each chunk is cut into one part per thread, gathered side by side into the same
        # buffer: a chunk is ready when its parts are, and no thread waits behind a slower one's whole chunk.
        n_parts = n_threads if n_threads > 1 and split is None and (recycler is not None or ring is not None) else 1

        def items(source: Iterator[Chunk]) -> Iterator[tuple[Any, ...]]:
            for idx, sizes in source:   # runs in a gather thread, under the prefetcher's lock: never blocks
                n = len(idx)
                box = _ChunkBuffer(n, n_parts, recycler, ring)
                if n_parts == 1:
                    yield idx, sizes, box, 0, n
                    continue
                cuts = [n * j // n_parts for j in range(n_parts + 1)]
                for a, b in itertools.pairwise(cuts):
                    yield idx, sizes, box, a, b

        def work(item: tuple[Any, ...]) -> tuple[Any, list[int], Any] | None:
            idx, sizes, box, a, b = item
            out = box.get()   # the first part to run takes the chunk's buffer (a ring slot may wait for its copy)
            if out is not None:
                try:
                    gather(idx[a:b], out=out if b - a == len(idx) else {k: v[a:b] for k, v in out.items()})
                except BaseException:
                    box.release()
                    raise
                if not box.part_done():
                    return None          # not the last part: the chunk is delivered with the last one
                data: Any = out
            else:
                data = gather(idx)
                if pin:
                    data = map_tensors(lambda t: t.pin_memory(), data)
            if split is not None:
                return [split(bt) for bt, _ in slices(data, sizes)], sizes, "ready"
            return data, sizes, box.slot   # a ring slot travels with its chunk to the copy stage

        if n_threads == 0:   # on demand, one chunk at a time, in a helper thread kept off OpenMP
            if self._sync is None:
                self._sync = SingleThreaded()
            try:
                for item in items(chunks):
                    yield self._sync.call(work, item)
            finally:   # also when the pass is abandoned (a `break`): the next pass reuses the ring
                if ring is not None:
                    self._passes -= 1
            return
        with KeepTorchThreads():  # the constructor returns once every thread has lowered its own count
            pf: OrderedPrefetcher[Any, Any] = OrderedPrefetcher(items(chunks), work, n_threads=n_threads,
                                                                depth=depth * n_parts,
                                                                thread_init=single_threaded_torch)
        try:
            for item in pf:   # not `yield from`: that would forward close() to pf, joining stuck producers
                if item is not None:
                    yield item
        finally:
            pf.close(join=False)
            if ring is not None:   # producers may wait for slots held by chunks nobody will consume
                for k in range(len(ring)):
                    ring.release(k)
            pf.join()
            if ring is not None:
                self._passes -= 1

    def _host_processes(self, chunks: list[Chunk]) -> Iterator[tuple[Any, list[int], Any]]:
        if self._pool is None:
            capacity = self._batches_per_chunk() * self.batch_size
            fetch = ChunkFetch(self.source, self.layout, capacity, self.config["prefetch"] + 4, self.collate_fn)
            self._pool = ProcessPool(fetch, self.num_workers, self.config["prefetch"],
                                     persistent=self._persistent is not False, **self._worker_options)
        for data, sizes, ready in self._pool.run(chunks):
            yield data, sizes, ("ready" if ready else None)

    def _make_recycler(self, slots: int, capacity: int) -> Recycler:
        if self._recycler is None or self._recycler.capacity != capacity:
            assert self.layout is not None
            self._recycler = Recycler(self.layout, capacity, slots)
        return self._recycler

    def _make_ring(self, n_slots: int, capacity: int) -> HostRing:
        """A ring for one pass. Each pass gets its own slot state (a pass that stopped early, `break`, keeps its
        slots held and may still release them late); the pinned buffers are reused when no other pass is running
        and no copy out of them can still be in flight."""
        assert self.layout is not None
        self._passes += 1
        if self._ring is not None and self._ring_key == (n_slots, capacity) and self._passes == 1:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)   # copies of an abandoned pass may still read them
            self._ring = HostRing(n_slots, lambda: None, buffers=self._ring.buffers)
        else:
            self._ring = HostRing(n_slots, pinned_alloc(self.layout, capacity))
            self._ring_key = (n_slots, capacity)
        return self._ring

    def close(self) -> None:
        """Stop worker processes and the on-demand gather thread (prefetch threads end with each pass)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        sync, self._sync = self._sync, None
        if sync is not None:
            sync.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- epochs and state -------------------------------------------------------------
    def index_batches(self) -> Iterator[np.ndarray]:
        """The remaining index batches of the current epoch, in order (does not advance the position)."""
        return iter(self.batch_sampler)

    def __len__(self) -> int:
        """Batches per full epoch on this rank."""
        return len(self.batch_sampler)

    @property
    def epoch(self) -> int:
        return self.batch_sampler.epoch

    @property
    def rank(self) -> int:
        return self.batch_sampler.rank

    @property
    def world_size(self) -> int:
        return self.batch_sampler.world_size

    @property
    def dataset(self) -> BatchSource:
        return self.source

    @property
    def sampler(self) -> EpochBatches:
        """The order (``set_epoch``), under the name frameworks look for (Lightning calls
        ``loader.sampler.set_epoch(epoch)`` each epoch)."""
        return self.batch_sampler

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a no-op for the current epoch (keeps a resumed position)."""
        self.batch_sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "seed", "position", ...}``: plain values, safe to save with a checkpoint."""
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state: the next iteration yields exactly the remaining batches of that epoch."""
        self.batch_sampler.load_state_dict(state)

    def __repr__(self) -> str:
        s = self.batch_sampler
        c = self.config
        return (f"KlineLoader({len(self.source)} samples, batch_size={self.batch_size}, epoch={s.epoch}, "
                f"position={s.position}, rank={s.rank}/{s.world_size}, device={str(self.device)!r}, "
                f"placement={self.placement!r}, {c['backend']} x{self.num_workers}, prefetch {c['prefetch']})")


def describe_config(loader: KlineLoader) -> str:
    """One line: where batches come from (for benchmarks and logs)."""
    c = loader.config
    who = "training thread" if loader.num_workers == 0 else f"{loader.num_workers} {c['backend']}"
    return (f"placement {loader.placement}, {who}, prefetch {c['prefetch']}, "
            f"pinned {c['pin_memory'] and device_kind(loader.device) == 'cuda'}")


__all__ = ["CHUNK_BYTES", "BatchSource", "KlineLoader", "chunk_plan", "describe_config", "dist_rank_world"]
