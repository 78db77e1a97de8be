"""KlineLoader: the order of an epoch (``sampling.py``), gathered a chunk of batches at a time, delivered as batches.

    index batches (seed, epoch, rank, world)                                 sampling.py, computed ahead: chunks.py
      -> chunks of consecutive batches (1, 2, 4, ... then ~CHUNK_BYTES): the fixed cost of a gather call is paid
         once per chunk, and batches are views of the chunk
      -> host stage (host.py): gathered in the training thread (num_workers=0), in threads that release the GIL (the
         default: as many as this rank's share of the cores), or in worker processes (backend="processes",
         through a shared-memory ring); into reused buffers (recycled CPU buffers, or pinned ring slots for a GPU)
      -> device stage (device.py, device="cuda"): side-stream copies one chunk ahead, or a GPU-resident panel
      -> batches, in order; the position advances when a batch is handed out, never when it is prefetched

The order depends only on ``(seed, epoch, rank, world_size)``: workers, threads and chunking never change it, and
``state_dict()`` taken mid-epoch resumes exactly at the next batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from .agreement import agree_samples
from .batches import slices
from .block_feed import BlockBatches, check_loader_memory, make_sampler
from .source import BatchLayout, BatchSource
from .chunks import CHUNK_BYTES, DEVICE_CHUNK_BYTES, OrderAhead, batches_per_chunk, chunk_plan
from .config import device_kind, resolve_config
from .device import HostItem, cuda_stage, resident_stream
from .host import HostStage
from .options import DATALOADER_KEYWORDS, LoaderOptions
from .placement import PLACEMENTS, choose_placement, device_free_bytes, host_available_bytes
from .sampling import EpochBatches, Tail, padded
from .states import check_state
from ..system.cores import usable_cores
from ..system.ranks import agreed_version  # noqa: F401  (its old home)

Batch = dict[str, torch.Tensor]

_DATALOADER_KWARGS = DATALOADER_KEYWORDS   # the old name


def _sample_bytes(layout: BatchLayout | None) -> int:
    if layout is None:
        return 0
    return sum(int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dt).element_size()
               for shape, dt in layout.values())


def dist_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed's when it is initialised, else ``(0, 1)``."""
    if (rank is None or world_size is None) and torch.distributed.is_available() \
            and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank() if rank is None else rank
        world_size = torch.distributed.get_world_size() if world_size is None else world_size
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


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
            ceil(n / world) samples; all samples covered; over several ranks every batch carries ``padded``, a bool
            ``[B]`` tensor marking the repeated ones, for an evaluation that counts each sample once), "drop" (leave
            the last n % world out this epoch) or "uneven" (each rank its own samples, none repeated or left out;
            ranks differ by at most one batch: for evaluation, see docs/guide/training.md, "Distributed training
            and evaluation").
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
        order: "uniform" (a permutation of every window per epoch: 4 bytes a window, for stores that fit in
            memory), "blocks" (blocks of a symbol's bars, or of consecutive dates for a CrossSectionDataset,
            permuted, each batch drawn from a pool of ``pool_blocks`` live blocks, read ahead and released: memory
            O(blocks), for stores bigger than memory; see ``feed/block_order.py``) or "auto" (default: blocks
            when the bytes samples read exceed half the available memory, the cgroup's limit where one is set).
        pool_blocks: K, blocks live at a time in the block order (default max(1024, 8 x batch_size); for a
            CrossSectionDataset, whose blocks are runs of dates across the symbols, max(64, 8 x batch_size)).
        block_bytes: bytes of bars per block (default: a quarter of the available memory over the pool, 64 KiB
            to 4 MiB; for a CrossSectionDataset from one segment of days to 4 MiB of each symbol row).

    Attributes:
        batch_sampler: the :class:`~kline_store.feed.sampling.EpochBatches` holding order and position.
        device, placement, config: what was resolved (``config_source``: "default", "tuned" or "given").
    """

    def __init__(self, source: BatchSource, batch_size: int = 256, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_workers: int | None = None, *, rank: int | None = None,
                 world_size: int | None = None, tail: Tail = "pad", device: Any = None,
                 placement: str = "auto", config: Any = None, backend: str | None = None, order: str = "auto",
                 pool_blocks: int | None = None, block_bytes: int | None = None,
                 options: LoaderOptions | None = None, **dataloader_kwargs: Any) -> None:
        given = LoaderOptions.of(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                 num_workers=num_workers, rank=rank, world_size=world_size, tail=tail, device=device,
                                 placement=placement, config=config, backend=backend, order=order,
                                 pool_blocks=pool_blocks, block_bytes=block_bytes, **dataloader_kwargs)
        if options is None:
            options = given
        elif given != LoaderOptions():
            raise InputError("KlineLoader(options=...): give the options object or keywords, not both "
                             "(options.replace(...) changes some of them)")
        self.options = options
        self._setup(source, options)

    def _setup(self, source: BatchSource, opts: LoaderOptions) -> None:
        if opts.in_order is False:
            raise InputError("loader(in_order=False): batches would arrive in worker timing order; the loader's "
                             "order must depend only on (seed, epoch, rank, world_size)")
        rank, world_size = dist_rank_world(opts.rank, opts.world_size)
        agree_samples(source, rank, world_size)   # before the order is made from its length
        self.source = source
        self.batch_size = int(opts.batch_size)
        self.batch_sampler: EpochBatches | BlockBatches
        self.batch_sampler, self.order = make_sampler(source, opts.order, self.batch_size, opts.shuffle, opts.seed,
                                                      opts.drop_last, rank, world_size, opts.tail, opts.pool_blocks,
                                                      opts.block_bytes)
        self._orders = OrderAhead(self.batch_sampler)
        self._orders.start(self.batch_sampler.epoch)
        device, placement, num_workers, backend = opts.device, opts.placement, opts.num_workers, opts.backend
        self.device = self._check_device(device)
        cuda = self.device.type == "cuda"
        cfg, self.config_source = resolve_config(opts.config, source.path, source.window, self.batch_size, self.device)
        explicit = {"backend": backend, "num_workers": num_workers, "prefetch": opts.prefetch_factor,
                    "pin_memory": opts.pin_memory}
        cfg.update({k: v for k, v in explicit.items() if v is not None})
        if any(v is not None for v in explicit.values()):
            cfg, _ = resolve_config(cfg, source.path, source.window, self.batch_size, self.device)
        self.config = cfg
        self.collate_fn = opts.collate_fn
        self._worker_options = {k: v for k, v in opts.dataloader_keywords().items()
                                if k in ("worker_init_fn", "multiprocessing_context", "timeout")}
        self._persistent = opts.persistent_workers
        self.layout = source.batch_layout
        per_chunk = self._batches_per_chunk() if self.layout is not None else 1
        check_loader_memory(self.order, self.batch_sampler, per_chunk * self.batch_size * _sample_bytes(self.layout),
                            max(1, cfg["prefetch"]) * max(1, self.num_workers) + 2,
                            processes=cfg["backend"] == "processes" and self.num_workers > 0)
        if placement not in PLACEMENTS:
            raise InputError(f"placement must be one of {', '.join(PLACEMENTS)}; got {placement!r}")
        if placement in ("device", "pinned") and self.layout is None:
            raise InputError(f"placement={placement!r} needs a dataset with a panel copy (KlineDataset); "
                             f"{type(source).__name__} supports placement='memmap'")
        if self.order == "blocks" and placement in ("device", "pinned"):
            raise InputError(f"placement={placement!r} copies the whole panel; order='blocks' is for stores bigger "
                             f"than memory and reads them from the memmap: use placement='memmap' (or 'auto')")
        placement = "memmap" if self.order == "blocks" else placement
        nbytes = source.resident_nbytes() if cuda and placement == "auto" and self.layout is not None else 0
        self.placement = choose_placement(nbytes, cuda=cuda, requested=placement,
                                          device_free=device_free_bytes(self.device) if nbytes else None,
                                          host_available=host_available_bytes() if nbytes else None)
        self._gather: Callable[..., Batch] | None = None
        self._host = HostStage(source, self.layout, self._batches_per_chunk() * self.batch_size, cfg,
                               self.collate_fn, self.device, self._worker_options, self._persistent)

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
        return batches_per_chunk(self.layout, self.batch_size)

    # -- iteration ------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        sampler = self.batch_sampler
        started = sampler.epoch
        self._orders.install(started)
        self._orders.start(started + 1)
        stream = self._stream(iter(sampler))
        try:
            for batch, n in stream:
                at = sampler.position
                sampler.advance(n)  # before handing it out: a state_dict taken now includes it
                yield self._mark(batch, at, n)
        finally:
            stream.close()
        if sampler.epoch == started:  # nothing left in this epoch (empty shard, or a resumed end): next one
            sampler.set_epoch(started + 1)

    def _mark(self, batch: Any, at: int, n: int) -> Any:
        """Over several ranks with ``tail="pad"``, ``batch["padded"]``: which of its ``n`` samples (shard positions
        ``at ..``) repeat another rank's (sampling.padded), on the batch's device; every batch of every rank has
        it. One rank repeats nothing: its batches stay those of ``gather_batch`` and a plain DataLoader. A
        collate_fn's non-dict batch is left as it is."""
        s = self.batch_sampler
        if s.tail != "pad" or s.world_size == 1 or not isinstance(batch, MutableMapping):
            return batch
        device = next((v.device for v in batch.values() if isinstance(v, torch.Tensor)), self.device)
        batch["padded"] = torch.from_numpy(padded(at, n, s.n, s.rank, s.world_size)).to(device, non_blocking=True)
        return batch

    def _stream(self, batches: Iterator[np.ndarray]) -> Iterator[tuple[Any, int]]:
        cuda = self.device.type == "cuda"
        if self.placement == "device" and cuda:
            per_chunk = batches_per_chunk(self.layout, self.batch_size, DEVICE_CHUNK_BYTES)
            stream = resident_stream(self.gather_fn(), list(chunk_plan(batches, per_chunk)), self.device)
            yield from self._collated(stream)
            return
        chunks = chunk_plan(batches, self._batches_per_chunk())
        pin = cuda and self.config["pin_memory"]
        if self.backend == "processes" and self.num_workers > 0 and self.placement == "memmap":
            host = self._host.processes(list(chunks), self.num_workers)
        else:
            host = self._host.threads(chunks, self.gather_fn(), self.num_workers, pin)
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

    def close(self) -> None:
        """Stop worker processes and the on-demand gather thread (prefetch threads end with each pass)."""
        self._host.close()
        residency = self.batch_sampler.residency
        if residency is not None:
            residency.close()

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
        """``{"epoch", "seed", "position", ..., "version"}``: plain values, safe to save with a checkpoint (the
        store version the order was made on, when the source has one)."""
        state = self.batch_sampler.state_dict()
        version = self.source.version
        return {**state, "version": int(version)} if version is not None else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state: the next iteration yields exactly the remaining batches of that epoch.
        A state taken on another store version is refused in one line (its order indexes other samples). In the
        block order, blocks sized from the available memory (no ``block_bytes=``) take the saved run's size."""
        state = check_state(state)
        version = self.source.version
        if state.get("version") is not None and version is not None and state["version"] != version:
            raise InputError(f"loader state was taken on store version {state['version']!r}; this dataset reads "
                             f"version {version}: open the dataset with version={state['version']!r} to resume")
        size = state.get("block_bytes") if state.get("order") == "blocks" else None
        if self.order == "blocks" and size and self.options.block_bytes is None \
                and size != self.batch_sampler.block_bytes:
            self._resample(int(size))
        self.batch_sampler.load_state_dict(state)

    def _resample(self, block_bytes: int) -> None:
        """The block order again with blocks of ``block_bytes`` (those of the run a state was saved in)."""
        o, old = self.options, self.batch_sampler
        self.batch_sampler, _ = make_sampler(self.source, "blocks", self.batch_size, o.shuffle, o.seed, o.drop_last,
                                             old.rank, old.world_size, o.tail, o.pool_blocks, block_bytes)
        if old.residency is not None:
            old.residency.close()
        self._orders = OrderAhead(self.batch_sampler)
        self._orders.start(self.batch_sampler.epoch)

    def __repr__(self) -> str:
        s = self.batch_sampler
        c = self.config
        return (f"KlineLoader({len(self.source)} samples, batch_size={self.batch_size}, epoch={s.epoch}, "
                f"position={s.position}, rank={s.rank}/{s.world_size}, device={str(self.device)!r}, "
                f"order={self.order!r}, placement={self.placement!r}, {c['backend']} x{self.num_workers}, "
                f"prefetch {c['prefetch']})")


def describe_config(loader: KlineLoader) -> str:
    """One line: where batches come from (for benchmarks and logs)."""
    c = loader.config
    who = "training thread" if loader.num_workers == 0 else f"{loader.num_workers} {c['backend']}"
    return (f"placement {loader.placement}, {who}, prefetch {c['prefetch']}, "
            f"pinned {c['pin_memory'] and device_kind(loader.device) == 'cuda'}")


__all__ = ["CHUNK_BYTES", "BatchSource", "KlineLoader", "LoaderOptions", "chunk_plan", "describe_config", "dist_rank_world"]
