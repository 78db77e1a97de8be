"""Keep the device fed: placement choice, pinned staging ring, side-stream copies, GPU-resident gather.

``ds.loader(..., device=..., placement=..., config=...)`` ends here, in ``wrap_loader``. The pipeline per epoch:

    index batches (the loader's order) --> chunks of consecutive batches (1, 2, 4, ... then ~CHUNK_BYTES)
      placement "device" on CUDA:  panel uploaded once, the epoch's order uploaded once; per chunk a device
                                   slice and the gather kernels, no host work
      otherwise:                   host gather of each chunk, from the memmap ("memmap"), a pinned copy
                                   ("pinned") or a RAM copy ("device" on the CPU), in threads that release
                                   the GIL (or DataLoader worker processes), into
                                     CUDA: pinned ring slots --> one non_blocking copy per chunk on a side
                                           stream, the next chunk's copy in flight while this one is consumed,
                                           a slot refilled only after its copy event completed
                                     CPU:  recycled buffers, reused once no batch handed out from them is alive
      --> batches = slices of the chunk, identical to the loader's own, in its order; the loader's position
          advances as each batch is handed out

Gathering several batches per call amortises the fixed per-call cost that dominates small batches.
"""

from __future__ import annotations

import collections
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from .errors import InputError

if TYPE_CHECKING:
    import torch

__all__ = [
    "PLACEMENTS",
    "DeviceLoader",
    "HostRing",
    "OrderedPrefetcher",
    "Recycler",
    "choose_placement",
    "host_available_bytes",
    "device_free_bytes",
    "wrap_loader",
]

PLACEMENTS = ("auto", "device", "pinned", "memmap")
# Fractions of free memory a panel may take: leave the device room for the model and activations.
DEVICE_FRACTION = 0.5
PINNED_FRACTION = 0.25
# Bytes gathered per host call (several batches): the fixed cost of a gather call (Python, index arithmetic,
# a dozen small kernels) is paid once per chunk instead of once per batch; batches are views of the chunk.
CHUNK_BYTES = 8 << 20

T = TypeVar("T")
R = TypeVar("R")


# --------------------------------------------------------------------------- placement (pure)


def choose_placement(
    nbytes: int,
    *,
    cuda: bool,
    requested: str = "auto",
    device_free: int | None = None,
    host_available: int | None = None,
    device_fraction: float = DEVICE_FRACTION,
    pinned_fraction: float = PINNED_FRACTION,
    layout_gain: bool = False,
) -> str:
    """Where the panel (selected fields and date range) should live.

    ``auto`` picks ``device`` when the panel fits in ``device_fraction`` of the free device memory, else
    ``pinned`` when it fits in ``pinned_fraction`` of the available host memory, else ``memmap``. Without CUDA,
    ``auto`` is ``memmap`` (the page cache already holds the file in RAM, a copy would only double it) unless
    ``layout_gain``: the samples use a subset of the store's fields, so the memmap gather copies strided
    rows while a compact RAM copy (those fields side by side, ``device`` on the CPU) is gathered about 1.5-2x
    faster; then the copy is made when it fits in ``pinned_fraction`` of the available host memory.

    Args:
        nbytes: bytes of the panel to place.
        cuda: whether batches go to a CUDA device.
        requested: "auto", or a placement to force.
        device_free: free device memory in bytes (None: unknown, treated as 0).
        host_available: available host memory in bytes (None: unknown, treated as 0).
        layout_gain: a compact copy would have a faster layout than the memmap (CPU only).
        device_fraction: share of free device memory the panel may use.
        pinned_fraction: share of available host memory the pinned panel may use.

    Returns:
        "device", "pinned" or "memmap".

    Raises:
        InputError: unknown placement, or "pinned" without CUDA.
    """
    if requested not in PLACEMENTS:
        raise InputError(f"placement must be one of {', '.join(PLACEMENTS)}; got {requested!r}")
    if requested == "pinned" and not cuda:
        raise InputError(
            "placement='pinned' needs a CUDA device (pinned memory only speeds up copies to a GPU); "
            "use placement='memmap' or 'device' with device='cpu'"
        )
    if requested != "auto":
        return requested
    if not cuda:
        return "device" if layout_gain and nbytes <= (host_available or 0) * pinned_fraction else "memmap"
    if nbytes <= (device_free or 0) * device_fraction:
        return "device"
    if nbytes <= (host_available or 0) * pinned_fraction:
        return "pinned"
    return "memmap"


def host_available_bytes() -> int:
    """Available host memory (``MemAvailable``), or physical memory when /proc is not there."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def device_free_bytes(device: Any) -> int | None:
    """Free memory of a CUDA device in bytes; None for the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free)


# --------------------------------------------------------------------------- host staging ring


class HostRing:
    """A fixed set of host buffers reused round-robin; a buffer is handed out again only after its copy finished.

    The consumer releases a slot together with the event recorded after the copy that reads it; ``acquire``
    waits on that event (in the producer's thread, off the training loop) before the slot may be overwritten.

    Args:
        n_slots: number of buffers.
        alloc: makes one buffer (called ``n_slots`` times, eagerly).
    """

    def __init__(self, n_slots: int, alloc: Callable[[], Any], buffers: list[Any] | None = None) -> None:
        if n_slots < 1:
            raise InputError(f"HostRing needs at least one slot (got {n_slots})")
        self._free: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        # ``buffers``: reuse another ring's (pinned memory is costly to allocate), with fresh slot state.
        self.buffers = buffers if buffers is not None else [alloc() for _ in range(n_slots)]
        self._pending: list[Any] = [None] * n_slots
        for k in range(n_slots):
            self._free.put((k, None))
        self.acquired: list[int] = []  # slot order, for tests and diagnostics (bounded below)

    def __len__(self) -> int:
        return len(self.buffers)

    def acquire(self, timeout: float | None = None) -> int:
        """Take a free slot (blocking), wait until the last copy out of it completed, return its number."""
        try:
            k, event = self._free.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("HostRing: no slot was released in time") from None
        if event is not None:
            event.synchronize()
        if len(self.acquired) < 4096:
            self.acquired.append(k)
        return k

    def release(self, k: int, event: Any = None) -> None:
        """Give slot ``k`` back; ``event`` (``synchronize()``-able) marks the end of the copy reading it."""
        self._free.put((k, event))


class Recycler:
    """Host buffers for batches that stay on the CPU, reused once nothing handed out from them is alive.

    Fresh multi-megabyte tensors cost page faults on every chunk when they are allocated in a worker thread
    (they come from newly mapped memory), which can double the price of a gather. Here each slot is a set of
    numpy arrays; the tensors handed out are ``torch.from_numpy`` views, which keep a reference to their array.
    A slot whose arrays are referenced by nothing but the recycler is free again, so batches a caller keeps (a
    list of them, a batch stored for later) are never overwritten: the recycler takes another slot instead.

    Args:
        template: ``{key: (trailing shape, numpy dtype)}`` of one sample.
        capacity: samples per slot.
        max_slots: slots kept for reuse; beyond them, buffers are fresh and not kept.
    """

    def __init__(self, template: dict[str, tuple[tuple[int, ...], Any]], capacity: int, max_slots: int) -> None:
        self.template, self.capacity, self.max_slots = template, capacity, max_slots
        self.slots: list[dict[str, np.ndarray]] = []
        self._base: list[int] = []
        self._lock = threading.Lock()
        self.reused = 0

    def _alloc(self) -> dict[str, np.ndarray]:
        return {k: np.empty((self.capacity, *shape), dtype=dt) for k, (shape, dt) in self.template.items()}

    def _refs(self, k: int) -> int:
        # Each array is referenced by its slot, by this loop, and once more while any tensor views it.
        return max(sys.getrefcount(a) for a in self.slots[k].values())

    def take(self, n: int) -> dict[str, Any]:
        """Tensors for ``n <= capacity`` samples: views of a free slot, or fresh ones when none is free."""
        import torch

        with self._lock:  # selecting a slot and creating its views must be atomic between producer threads
            for k in range(len(self.slots)):
                if self._refs(k) <= self._base[k]:
                    self.reused += 1
                    return {key: torch.from_numpy(a[:n]) for key, a in self.slots[k].items()}
            slot = self._alloc()
            if len(self.slots) < self.max_slots:
                self.slots.append(slot)
                self._base.append(self._refs(len(self.slots) - 1))  # before any view exists
            return {key: torch.from_numpy(a[:n]) for key, a in slot.items()}


# --------------------------------------------------------------------------- ordered prefetch in threads


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class OrderedPrefetcher(Generic[T, R]):
    """Apply ``work`` to the items of an iterator in background threads; yield results in input order.

    At most ``depth`` items are in progress or waiting for the consumer, so memory stays bounded and a slow
    consumer throttles the producers. With ``n_threads=0`` the work runs inline in the consumer (no prefetch).
    An exception in ``work`` is raised to the consumer at the position of the item that caused it.

    Args:
        items: the inputs, consumed under a lock (any iterator).
        work: item -> result; should release the GIL for the bulk of its time (torch/numpy kernels do).
        n_threads: background threads.
        depth: items in flight ahead of the consumer (>= 1).
        thread_init: called once at the start of each thread (e.g. to limit torch's intra-op threads); the
            constructor returns only after every thread has run it.
    """

    def __init__(
        self,
        items: Iterable[T],
        work: Callable[[T], R],
        *,
        n_threads: int = 1,
        depth: int = 2,
        thread_init: Callable[[], None] | None = None,
    ) -> None:
        if n_threads < 0 or depth < 1:
            raise InputError(f"prefetch: n_threads must be >= 0 and depth >= 1 (got {n_threads}, {depth})")
        self._items = iter(items)
        self._work = work
        self._depth = depth
        self._cond = threading.Condition()
        self._taken = 0  # items handed to threads
        self._given = 0  # results handed to the consumer
        self._done: dict[int, Any] = {}
        self._end: int | None = None
        self._closed = False
        self._thread_init = thread_init
        self._initialised = threading.Semaphore(0)
        self._threads = [
            threading.Thread(target=self._run, name=f"kline-prefetch-{k}", daemon=True) for k in range(n_threads)
        ]
        for th in self._threads:
            th.start()
        for _ in self._threads:
            self._initialised.acquire()

    def _run(self) -> None:
        try:
            if self._thread_init is not None:
                self._thread_init()
        finally:
            self._initialised.release()
        while True:
            with self._cond:
                while not self._closed and self._end is None and self._taken - self._given >= self._depth:
                    self._cond.wait()
                if self._closed or self._end is not None:
                    return
                try:
                    item = next(self._items)
                except StopIteration:
                    self._end = self._taken
                    self._cond.notify_all()
                    return
                except BaseException as exc:  # a failing index source ends the stream with its error
                    self._end = self._taken + 1
                    self._done[self._taken] = _Failure(exc)
                    self._taken += 1
                    self._cond.notify_all()
                    return
                seq = self._taken
                self._taken += 1
            try:
                result: Any = self._work(item)
            except BaseException as exc:
                result = _Failure(exc)
            with self._cond:
                self._done[seq] = result
                self._cond.notify_all()

    def __iter__(self) -> OrderedPrefetcher[T, R]:
        return self

    def __next__(self) -> R:
        if not self._threads:
            return self._next_inline()
        with self._cond:
            while self._given not in self._done:
                if self._closed or (self._end is not None and self._given >= self._end):
                    raise StopIteration
                self._cond.wait()
            result = self._done.pop(self._given)
            self._given += 1
            self._cond.notify_all()
        if isinstance(result, _Failure):
            self.close()
            raise result.exc
        return result

    def _next_inline(self) -> R:
        if self._closed:
            raise StopIteration
        item = next(self._items)
        self._given += 1
        return self._work(item)

    def close(self, join: bool = True) -> None:
        """Stop the threads (items in progress finish, their results are dropped).

        Args:
            join: wait for the threads; False lets the caller first unblock a thread stuck in its work (a
                producer waiting for a ring slot) and then call :meth:`join`.
        """
        with self._cond:
            self._closed = True
            self._done.clear()
            self._cond.notify_all()
        if join:
            self.join()

    def join(self) -> None:
        for th in self._threads:
            if th is not threading.current_thread():
                th.join(timeout=10)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _single_threaded_torch() -> None:
    # Each prefetch thread gathers on one core; intra-op threads on top of that fight over the same cores (and
    # an OpenMP barrier stalls badly when a core is busy elsewhere). get_num_threads() first: it runs torch's
    # per-thread lazy init, which would otherwise later reset this thread to the global count.
    import torch

    torch.get_num_threads()
    torch.set_num_threads(1)


class _KeepTorchThreads:
    """Restore torch's global intra-op thread count after prefetch threads lowered their own.

    ``torch.set_num_threads`` in a worker also changes the process-wide default that threads initialise from
    later, including the main thread if it has not run a parallel op yet: the training loop would silently run
    on one core. Entering initialises the calling thread; leaving puts the default back.
    """

    def __enter__(self) -> None:
        import torch

        self.count = torch.get_num_threads()

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.set_num_threads(self.count)


# --------------------------------------------------------------------------- batch structure helpers


def _map(fn: Callable[[Any], Any], batch: Any) -> Any:
    """Apply ``fn`` to every tensor in a batch (tensor, tuple, list, dict, or nested)."""
    if isinstance(batch, tuple):
        if hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*(_map(fn, b) for b in batch))
        return tuple(_map(fn, b) for b in batch)
    if isinstance(batch, list):
        return [_map(fn, b) for b in batch]
    if isinstance(batch, dict):
        return {k: _map(fn, v) for k, v in batch.items()}
    if hasattr(batch, "shape") and hasattr(batch, "__getitem__"):
        return fn(batch)
    return batch


def _leaves(batch: Any) -> list[Any]:
    out: list[Any] = []
    _map(lambda t: out.append(t), batch)
    return out


def _slices(batch: Any, sizes: Sequence[int]) -> Iterator[tuple[Any, int]]:
    """Cut a gathered chunk back into the loader's batches (views, no copy); yields ``(batch, size)``."""
    if len(sizes) == 1:
        yield batch, sizes[0]
        return
    start = 0
    if isinstance(batch, dict) and all(hasattr(v, "shape") for v in batch.values()):
        items = list(batch.items())  # the common case (KlineDataset's dict), without the generic walk
        for n in sizes:
            end = start + n
            yield {k: v[start:end] for k, v in items}, n
            start = end
        return
    for n in sizes:
        a, b = start, start + n
        yield _map(lambda t, a=a, b=b: t[a:b], batch), n
        start = b


# --------------------------------------------------------------------------- the dataset/loader adapter


class _Source:
    """Everything the pipeline uses from ``KlineLoader`` / ``KlineDataset``, in one place.

    Loader: ``index_batches()`` (this epoch's remaining batches, not advancing), ``advance(n)`` (samples
    delivered), ``epoch``/``set_epoch``, ``batch_size``. Dataset: ``gather_batch(indices, out=None)`` (CPU,
    reads the memmap), ``to_device(device, pin=False)`` (copies the used panel once, returns a gather running
    there), ``panel_nbytes()``. A loader without ``index_batches`` (e.g. a plain DataLoader) is only iterated.
    """

    def __init__(self, loader: Any, dataset: Any) -> None:
        self.loader = loader
        self.dataset = dataset
        self.ordered = callable(getattr(loader, "index_batches", None)) and callable(getattr(loader, "advance", None))
        # Fixed-shape samples (KlineDataset windows) can be gathered several batches at a time into reusable
        # buffers and cut apart; CrossSectionDataset pads each batch to its own largest day, so it cannot. The
        # placement hook to_device() marks the former.
        self.fixed_shape = callable(getattr(dataset, "to_device", None))

    def index_batches(self) -> Iterator[np.ndarray]:
        return iter(self.loader.index_batches())

    def advance(self, n: int) -> None:
        self.loader.advance(n)

    def epoch(self) -> int | None:
        return getattr(self.loader, "epoch", None)

    def finish_epoch(self, started: int | None) -> None:
        # As KlineLoader.__iter__: an epoch that delivered nothing (empty shard, resumed at its end) moves on.
        if started is not None and self.epoch() == started and hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(started + 1)

    def panel_nbytes(self) -> int:
        fn = getattr(self.dataset, "panel_nbytes", None)
        return int(fn()) if callable(fn) else 0

    def memmap_gather(self) -> Callable[..., Any]:
        return self.dataset.gather_batch

    def copy_gather(self, device: Any, pin: bool = False) -> Callable[..., Any]:
        fn = getattr(self.dataset, "to_device", None)
        if not callable(fn):
            raise InputError(f"{type(self.dataset).__name__} cannot hold a panel copy (no to_device()); "
                             "use placement='memmap'")
        return fn(device, pin=pin) if pin else fn(device)


# --------------------------------------------------------------------------- the device loader


class DeviceLoader:
    """An iterable of batches already on ``device``; wraps a loader without changing its order or state.

    Created by ``wrap_loader`` (``ds.loader(device=..., placement=..., config=...)``). ``len()``,
    ``state_dict()``, ``load_state_dict()`` and ``set_epoch()`` pass through to the wrapped loader; the position
    advances when a batch is handed out, never when it is prefetched, so a state taken mid-epoch resumes exactly.

    Attributes:
        device: the torch.device batches are delivered on.
        placement: "device", "pinned" or "memmap" (what ``auto`` resolved to).
        config: the loader configuration in use (see ``kline_store.tune``).
        ring: the pinned staging ring (CUDA, threads backend), for diagnostics.
        recycler: the reusable CPU buffers (device "cpu", threads backend), for diagnostics.
    """

    def __init__(self, loader: Any, source: _Source, device: torch.device, placement: str,
                 config: dict[str, Any]) -> None:
        self.loader = loader
        self.source = source
        self.device = device
        self.placement = placement
        self.config = config
        self.ring: HostRing | None = None
        self._ring_capacity = 0
        self.recycler: Recycler | None = None
        self._gather: Callable[..., Any] | None = None
        self._sample_bytes: int | None = None

    # pass-through -----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def __repr__(self) -> str:
        return (f"DeviceLoader({self.loader!r}, device={str(self.device)!r}, placement={self.placement!r}, "
                f"config={self.config})")

    # gather functions ---------------------------------------------------------
    def gather_fn(self) -> Callable[..., Any]:
        """The batch gather for this placement (the panel copy is made on first use and kept)."""
        if self._gather is None:
            if self.placement == "memmap":
                self._gather = self.source.memmap_gather()
            elif self.placement == "pinned":
                self._gather = self.source.copy_gather("cpu", pin=True)
            else:  # "device": the GPU, or RAM when the device is the CPU
                self._gather = self.source.copy_gather(self.device)
        return self._gather

    def _sample_nbytes(self) -> int:
        if self._sample_bytes is None:
            probe = self.source.memmap_gather()(np.zeros(1, dtype=np.int64))
            self._sample_bytes = sum(int(t.numel()) * t.element_size() for t in _leaves(probe))
        return self._sample_bytes

    def _batch_size(self) -> int:
        return int(getattr(self.loader, "batch_size", 0) or 1)

    def _batches_per_chunk(self) -> int:
        if not self.source.fixed_shape:
            return 1
        return max(1, CHUNK_BYTES // max(1, self._sample_nbytes() * self._batch_size()))

    def _chunk_plan(self, batches: Iterable[np.ndarray]) -> Iterator[tuple[np.ndarray, list[int]]]:
        """Group consecutive index batches into chunks of about CHUNK_BYTES.

        The first chunks of an epoch are small (1, 2, 4, ... batches) so the first batch arrives after one
        batch's gather, not a whole chunk's; later chunks are full size.
        """
        per_chunk = self._batches_per_chunk()
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

    # iteration --------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if not self.source.ordered:
            return self._iter_generic()
        return self._iter_epoch()

    def _iter_epoch(self) -> Iterator[Any]:
        started = self.source.epoch()
        batches = self.source.index_batches()
        if self.placement == "device" and self.cuda:
            stream = self._iter_resident(batches)
        else:
            stream = self._iter_host(batches)
        advance = self.source.advance
        for batch, n in stream:
            advance(n)  # before handing it out: a state_dict taken now includes it
            yield batch
        self.source.finish_epoch(started)

    def _iter_generic(self) -> Iterator[Any]:
        """Any iterable of CPU batches: copied to the device one batch ahead (pinned first when asked)."""
        if not self.cuda:
            yield from self.loader
            return
        import torch

        pin = self.config["pin_memory"]

        def host() -> Iterator[tuple[Any, list[int], int | None]]:
            for b in self.loader:
                if pin:
                    b = _map(lambda t: t if not isinstance(t, torch.Tensor) or t.is_pinned() else t.pin_memory(), b)
                yield b, [_length(b)], None

        for batch, _n in self._cuda_stage(host(), torch):
            yield batch

    def _iter_host(self, batches: Iterator[np.ndarray]) -> Iterator[Any]:
        import torch

        cfg = self.config
        chunks = self._chunk_plan(batches)
        pin = self.cuda and cfg["pin_memory"]
        if cfg["backend"] == "processes" and cfg["num_workers"] > 0:
            host: Iterator[tuple[Any, list[int], int | None]] = self._host_processes(chunks, pin)
        else:
            host = self._host_threads(chunks, pin)
        if not self.cuda:
            for chunk, sizes, _slot in host:
                yield from _slices(chunk, sizes)
            return
        yield from self._cuda_stage(host, torch)

    def _host_threads(self, chunks: Iterator[tuple[np.ndarray, list[int]]],
                      pin: bool) -> Iterator[tuple[Any, list[int], int | None]]:
        cfg = self.config
        gather = self.gather_fn()
        capacity = self._batches_per_chunk() * self._batch_size()
        # depth chunks gathered ahead + one being copied + one spare for a producer to start on
        reuse = self.source.fixed_shape
        ring = self._make_ring(cfg["prefetch"] + 1 + max(1, cfg["num_workers"]), capacity) if pin and reuse else None
        recycler = self._make_recycler(capacity) if reuse and not pin else None

        def work(item: tuple[np.ndarray, list[int]]) -> tuple[Any, list[int], int | None]:
            idx, sizes = item
            if not reuse or len(idx) > capacity:  # no buffer fits: gather into fresh tensors
                fresh = gather(idx)
                return (_map(lambda t: t.pin_memory(), fresh) if pin else fresh), sizes, None
            if recycler is not None:
                return gather(idx, out=recycler.take(len(idx))), sizes, None
            if ring is None:
                return gather(idx), sizes, None
            k = ring.acquire()
            out = _map(lambda t: t[: len(idx)], ring.buffers[k])
            try:
                return gather(idx, out=out), sizes, (ring, k)   # the ring of this pass travels with its slot
            except BaseException:
                ring.release(k)
                raise

        with _KeepTorchThreads():  # the constructor returns once every thread has lowered its own count
            pf: OrderedPrefetcher[Any, Any] = OrderedPrefetcher(
                chunks, work, n_threads=cfg["num_workers"], depth=cfg["prefetch"],
                thread_init=_single_threaded_torch,
            )
        try:
            for item in pf:   # not `yield from`: that would forward close() to pf, joining stuck producers
                yield item
        finally:
            pf.close(join=False)
            if ring is not None:   # producers may wait for slots held by chunks nobody will consume
                for k in range(len(ring)):
                    ring.release(k)
            pf.join()
            if ring is not None:
                self._passes -= 1

    def _make_ring(self, n_slots: int, capacity: int) -> HostRing:
        """A ring for one pass. Each pass gets its own slot state (a pass that stopped early, `break`, keeps
        its slots held and may still release them late); the pinned buffers are reused when no other pass is
        running and no copy out of them can still be in flight."""
        import torch

        self._passes = getattr(self, "_passes", 0) + 1
        if (self.ring is not None and len(self.ring) == n_slots and self._ring_capacity == capacity
                and self._passes == 1):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)   # copies of an abandoned pass may still read them
            self.ring = HostRing(n_slots, lambda: None, buffers=self.ring.buffers)
        else:
            probe = self.source.memmap_gather()(np.zeros(1, dtype=np.int64))

            def alloc() -> Any:
                return _map(lambda t: torch.empty((capacity, *t.shape[1:]), dtype=t.dtype, pin_memory=True), probe)

            self.ring = HostRing(n_slots, alloc)
            self._ring_capacity = capacity
        return self.ring

    def _make_recycler(self, capacity: int) -> Recycler | None:
        """Reusable CPU buffers for gathers (dict batches only, as KlineDataset makes them)."""
        if self.recycler is None or self.recycler.capacity != capacity:
            probe = self.source.memmap_gather()(np.zeros(1, dtype=np.int64))
            if not isinstance(probe, dict):
                return None
            template = {k: (tuple(t.shape[1:]), t.numpy().dtype) for k, t in probe.items()}
            # chunks in flight, plus the one the consumer is slicing and the one it may still hold
            slots = self.config["prefetch"] + max(1, self.config["num_workers"]) + 2
            self.recycler = Recycler(template, capacity, slots)
        return self.recycler

    def _host_processes(self, chunks: Iterator[tuple[np.ndarray, list[int]]],
                        pin: bool) -> Iterator[tuple[Any, list[int], int | None]]:
        from torch.utils.data import DataLoader

        # Workers gather from the memmap (a pinned or device copy lives in this process only); the order is
        # fixed here and handed to them as index arrays, as KlineLoader does.
        plan = list(chunks)
        from .loader import _BatchFetch, _identity   # the same whole-batch fetch KlineLoader's workers use

        dl = DataLoader(_BatchFetch(self.source.dataset), batch_size=None, sampler=[idx for idx, _ in plan],
                        collate_fn=_identity, num_workers=self.config["num_workers"],
                        prefetch_factor=self.config["prefetch"], pin_memory=pin)
        for (_, sizes), chunk in zip(plan, dl):
            yield chunk, sizes, None

    def _cuda_stage(self, host: Iterator[tuple[Any, list[int], int | None]], torch: Any) -> Iterator[Any]:
        """Copy host chunks on a side stream, one chunk ahead of the consumer; yield device batches."""
        side = torch.cuda.Stream(self.device)
        inflight: collections.deque[tuple[Any, list[int], Any]] = collections.deque()

        def issue(item: tuple[Any, list[int], int | None]) -> None:
            chunk, sizes, slot = item
            with torch.cuda.stream(side):
                dev = _map(lambda t: t.to(self.device, non_blocking=True), chunk)
                event = torch.cuda.Event()
                event.record(side)
            if slot is not None:
                ring, k = slot
                ring.release(k, event)  # the producer waits on `event` before refilling the slot
            inflight.append((dev, sizes, event))

        source = iter(host)
        first = next(source, None)
        if first is not None:
            issue(first)
        while inflight:
            dev, sizes, event = inflight.popleft()
            nxt = next(source, None)  # keep the next chunk's copy in flight while this one is consumed
            if nxt is not None:
                issue(nxt)
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)  # GPU-side wait: the host does not block
            for t in _leaves(dev):
                t.record_stream(current)  # memory allocated on `side`, used on `current`
            yield from _slices(dev, sizes)

    def _iter_resident(self, batches: Iterator[np.ndarray]) -> Iterator[Any]:
        """Panel and the epoch's order on the device: per chunk, a device slice and the gather kernels."""
        import torch

        gather = self.gather_fn()
        plan = list(self._chunk_plan(batches))
        if not plan:
            return
        flat = torch.from_numpy(np.concatenate([idx for idx, _ in plan]))
        flat = flat.pin_memory().to(self.device, non_blocking=True)  # one upload per epoch
        start = 0
        for idx, sizes in plan:
            n = len(idx)
            yield from _slices(gather(flat[start : start + n]), sizes)
            start += n


def _length(batch: Any) -> int:
    from .meter import batch_length

    return batch_length(batch)


# --------------------------------------------------------------------------- entry point


def wrap_loader(
    loader: Any,
    dataset: Any,
    *,
    device: Any = None,
    placement: str = "auto",
    config: str | os.PathLike | dict[str, Any] | None = None,
) -> DeviceLoader:
    """Make a loader deliver batches on ``device``, placed and prefetched as ``placement`` and ``config`` say.

    Args:
        loader: the loader from ``KlineDataset.loader`` (its order, length and state are kept); any other
            iterable of CPU batches is only copied to the device, one batch ahead.
        dataset: the dataset it reads.
        device: "cpu", "cuda", "cuda:1", a torch.device, or None (cpu).
        placement: "auto" (device-resident if it fits, else pinned host memory, else memmap streaming),
            or one of "device", "pinned", "memmap" to force it. On the CPU, "device" is a copy in RAM.
        config: loader configuration: None (defaults, or the loader's ``num_workers`` processes when it has
            some), "auto" (the tuned one, see ``kline_store.tune``), a path to a tune JSON file, or a dict.

    Returns:
        A ``DeviceLoader``.

    Raises:
        InputError: CUDA requested but not available, unknown placement, bad config.
    """
    import torch

    from .tune import normalize_config, resolve_config

    dev = torch.device(device if device is not None else "cpu")
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"device must be 'cpu' or a CUDA device; got {str(dev)!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {str(dev)!r} requested but CUDA is not available; use device='cpu'")
    source = _Source(loader, dataset)
    if placement in ("device", "pinned") and not source.fixed_shape:
        raise InputError(f"placement={placement!r} needs a dataset with a panel copy (KlineDataset); "
                         f"{type(dataset).__name__} supports placement='memmap'")
    workers = int(getattr(loader, "num_workers", 0) or 0)
    if config is None and workers > 0:  # loader(num_workers=N, device=...) keeps its N worker processes
        cfg = normalize_config({"backend": "processes", "num_workers": workers})
    else:
        cfg = resolve_config(config, getattr(dataset, "path", "."), getattr(dataset, "window", 0),
                             getattr(loader, "batch_size", 0) or 0, dev)
    cuda = dev.type == "cuda"
    if placement == "auto" and cuda and source.fixed_shape:
        chosen = choose_placement(source.panel_nbytes(), cuda=True, device_free=device_free_bytes(dev),
                                  host_available=host_available_bytes())
    elif placement == "auto" and source.fixed_shape and not getattr(dataset, "memmap_is_compact", lambda: True)():
        chosen = choose_placement(source.panel_nbytes(), cuda=False, host_available=host_available_bytes(),
                                  layout_gain=True)
    else:
        chosen = choose_placement(0, cuda=cuda, requested="memmap" if placement == "auto" else placement)
    return DeviceLoader(loader, source, dev, chosen, cfg)
