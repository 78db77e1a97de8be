"""The rows of `kline-store bench`: every way users drive a loader, and the ceiling, each measured once.

``measure(name, run)`` runs one row on the windows of ``run`` and returns ``(windows/s, windows timed, note)``;
bench.py repeats the fast rows in interleaved rounds, bench_report.py prints them.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..feed.loader import describe_config
from ..system.cores import usable_cores
from ..system.pages import readahead
from ..feed.prefetch import KeepTorchThreads, SingleThreaded, single_threaded_torch
from ..samples.dataset import KlineDataset
from ..samples.gather import window_view
from . import classic
from .timing import shut_down, time_batches

RECIPE = {"num_workers": 4, "pin_memory": True, "prefetch_factor": 4, "persistent_workers": True}
VARIANTS = ("ceiling", "ceiling_first_touch", "kline_store", "later_epoch", "first_epoch", "block_order", "workers_0",
            "workers_2", "recipe_kwargs", "processes_2", "dataloader", "dataloader_2", "dataloader_recipe", "getitem",
            "classic_dl4", "classic_dl0", "file_read", "memmap_prefetch", "qlib_dataloader", "qlib_getitem", "memory")
CLASSIC = ("classic_dl4", "classic_dl0", "file_read", "memmap_prefetch")
PER_SAMPLE = ("getitem", "classic_dl4", "classic_dl0", "file_read", "memmap_prefetch", "qlib_dataloader",
              "qlib_getitem")
LABELS = {
    "ceiling": "bare index_select of the same windows, pages resident (best method)",
    "ceiling_first_touch": "bare index_select per batch, first pass over a fresh mapping",
    "kline_store": "ds.loader(batch_size=B, shuffle=True)",
    "later_epoch": "ds.loader(...) a whole later epoch of a loader in use (its next shuffle included)",
    "first_epoch": "ds.loader(...) whole first epoch after opening the store, its shuffle included",
    "block_order": "ds.loader(..., order='blocks', block_bytes=64 KiB): the order of stores bigger than memory",
    "workers_0": "ds.loader(..., num_workers=0)",
    "workers_2": "ds.loader(..., num_workers=2)",
    "recipe_kwargs": "ds.loader(..., num_workers=4, pin_memory=True, prefetch_factor=4, persistent_workers=True)",
    "processes_2": "ds.loader(..., backend='processes', num_workers=2)",
    "dataloader": "DataLoader(ds, batch_size=B, shuffle=True)",
    "dataloader_2": "DataLoader(ds, batch_size=B, shuffle=True, num_workers=2)",
    "dataloader_recipe": "DataLoader(ds, ..., num_workers=4, pin_memory=True, prefetch_factor=4, persistent_workers=True)",
    "getitem": "ds[i], one sample at a time",
    "classic_dl4": "np.memmap Dataset, DataLoader(num_workers=4, pin_memory, prefetch_factor=4, persistent)",
    "classic_dl0": "np.memmap Dataset, DataLoader(num_workers=0)",
    "file_read": "os.pread per sample, DataLoader(num_workers=0)",
    "memmap_prefetch": "np.memmap batches stacked by a prefetch thread (queue 4)",
    "qlib_dataloader": "Qlib TSDataSampler, DataLoader(batch_size=B, shuffle=True)",
    "qlib_getitem": "Qlib TSDataSampler[i], one sample at a time",
    "memcpy": "memcpy, 1 thread (bandwidth / sample bytes)",
    "memory": "a default loader's memory in a fresh process, first epoch, against index + two orders + buffers",
}
BLOCK_BYTES = 64 << 10   # the block_order row's blocks
QLIB_SYMBOLS = 200   # Qlib's sampler copies the bars into pandas first: a subset keeps its set-up bounded


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Single-thread memory copy bandwidth in bytes/s (best of ``repeats``; buffers touched first)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return src.nbytes / best


# --------------------------------------------------------------------------- the ceiling


def _per_batch(view: torch.Tensor, start: torch.Tensor, batch_size: int, one_thread: bool) -> float:
    """One ``index_select`` per batch: in this thread (torch's threads), or in a thread on one intra-op thread."""
    def run() -> float:
        out = torch.empty((batch_size, *view.shape[1:]))
        t0 = time.perf_counter()
        for a in range(0, len(start), batch_size):
            idx = start[a: a + batch_size]
            torch.index_select(view, 0, idx, out=out[: len(idx)])
        return len(start) / (time.perf_counter() - t0)

    if not one_thread:
        return run()
    helper = SingleThreaded()
    try:
        return helper.call(run)
    finally:
        helper.close()


def _chunks_in_threads(view: torch.Tensor, start: torch.Tensor, n_threads: int, chunk: int) -> float:
    parts = [start[a: a + chunk] for a in range(0, len(start), chunk)]
    barrier = threading.Barrier(n_threads + 1)

    def run(k: int) -> None:
        single_threaded_torch()
        out = torch.empty((chunk, *view.shape[1:]))
        barrier.wait()
        for idx in parts[k::n_threads]:
            torch.index_select(view, 0, idx, out=out[: len(idx)])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    with KeepTorchThreads():
        for th in threads:
            th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    return len(start) / (time.perf_counter() - t0)


def ceiling(ds: KlineDataset, start: torch.Tensor, batch_size: int) -> tuple[float, str]:
    """The fastest bare gather of the windows ``start`` from a resident mapping, and how it was made."""
    st = ds.store
    flat = st.map_private()
    used = st.n_dates * st.n_fields * 4   # each row's stored days: not the room it reserves (zeros, as much again)
    th = readahead(flat, np.arange(st.n_symbols, dtype=np.int64) * st.row_stride * 4, used, available=1 << 62)
    if th is not None:
        th.join()
    view = window_view(torch.from_numpy(flat), st.n_fields, ds.window, 0, st.n_fields)
    _per_batch(view, start[: 1 << 16], batch_size, True)   # warm: pages and code paths
    chunk = max(batch_size, (8 << 20) // (ds.window * st.n_fields * 4))
    rates = {f"one call per batch, torch threads ({torch.get_num_threads()})": _per_batch(view, start, batch_size,
                                                                                           False),
             "one call per batch, 1 thread": _per_batch(view, start, batch_size, True),
             f"chunks in {usable_cores()} threads": _chunks_in_threads(view, start, usable_cores(), chunk)}
    best = max(rates, key=rates.__getitem__)
    return rates[best], best


def _ceiling_first_touch(ds: KlineDataset, start: torch.Tensor, batch_size: int) -> float:
    st = ds.store
    view = window_view(torch.from_numpy(st.map_private()), st.n_fields, ds.window, 0, st.n_fields)
    return _per_batch(view, start, batch_size, False)


# --------------------------------------------------------------------------- rows


@dataclasses.dataclass
class BenchRun:
    """What every variant reads: the store, the dataset, the windows, the sizes."""

    store: Path
    ds: KlineDataset
    fields: list[str]
    batch_size: int
    n: int
    per_sample: int
    seed: int
    start: torch.Tensor
    layout: classic.WindowFile


def _loader_rate(make: Callable[[], Any], n: int, warmup: int) -> float:
    src = make()
    try:
        return time_batches(src, samples=n, warmup_batches=warmup).samples_per_s
    finally:
        shut_down(src)
        del src
        gc.collect()


def measure(name: str, run: BenchRun) -> tuple[float, int, str]:
    """``(windows/s, windows timed, note)`` of one variant, once."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")       # pinning without CUDA: the recipe asks
        warnings.filterwarnings("ignore", message="This DataLoader will create")   # 4 workers on fewer cores
        return _measure_loud(name, run)


def _measure_loud(name: str, run: BenchRun) -> tuple[float, int, str]:
    ds, b, n = run.ds, run.batch_size, run.n
    if name == "ceiling":
        rate, how = ceiling(ds, run.start, b)
        return rate, len(run.start), how
    if name == "ceiling_first_touch":
        return _ceiling_first_touch(ds, run.start, b), len(run.start), ""
    if name == "kline_store":
        return _loader_rate(lambda: ds.loader(batch_size=b, seed=run.seed), n, 8), n, ""
    if name == "later_epoch":   # a training run's steady state: no start-up, one background shuffle per epoch
        ld = ds.loader(batch_size=b, seed=run.seed)
        time_batches(ld, samples=n, warmup_batches=0)   # start-up: first order, threads, buffers
        ld.set_epoch(1)                                  # its order was shuffled in the background meanwhile
        m = min(5 * n, len(ds))
        t = time_batches(ld, samples=m - b, warmup_batches=0)
        shut_down(ld)
        return t.samples_per_s, t.samples, ""
    if name == "first_epoch":
        fresh = KlineDataset(run.store, window=ds.window, fields=run.fields)   # opened as a user would
        ld = fresh.loader(batch_size=b, seed=run.seed)
        m = min(5 * n, len(fresh))   # the whole first epoch (its shuffle included), at most 5 x samples
        t = time_batches(ld, samples=m - b, warmup_batches=0)
        shut_down(ld)
        return t.samples_per_s, t.samples, describe_config(ld)
    if name == "block_order":   # blocks of 64 KiB, as under a 1 GiB limit: many rounds, not one
        return _loader_rate(lambda: ds.loader(batch_size=b, seed=run.seed, order="blocks", block_bytes=BLOCK_BYTES),
                            n, 8), n, ""
    if name in ("workers_0", "workers_2"):
        k = int(name[-1])
        return _loader_rate(lambda: ds.loader(batch_size=b, seed=run.seed, num_workers=k), n, 8), n, ""
    if name == "recipe_kwargs":
        return _loader_rate(lambda: ds.loader(batch_size=b, seed=run.seed, **RECIPE), n, 8), n, ""
    if name == "processes_2":
        m = n // 2
        return _loader_rate(lambda: ds.loader(batch_size=b, seed=run.seed, backend="processes",
                                              num_workers=2), m, 16), m, ""
    if name == "dataloader":
        return _loader_rate(lambda: DataLoader(ds, batch_size=b, shuffle=True), n // 2, 8), n // 2, ""
    if name == "dataloader_2":
        m = n // 2
        return _loader_rate(lambda: DataLoader(ds, batch_size=b, shuffle=True, num_workers=2,
                                               persistent_workers=True), m, 16), m, ""
    if name == "dataloader_recipe":
        m = n // 2
        return _loader_rate(lambda: DataLoader(ds, batch_size=b, shuffle=True, **RECIPE), m, 32), m, ""
    return _measure_per_sample(name, run)


def _measure_per_sample(name: str, run: BenchRun) -> tuple[float, int, str]:
    b, m = run.batch_size, run.per_sample
    lay = run.layout
    if name == "getitem":
        ds = run.ds
        pos = np.random.default_rng(run.seed).integers(0, len(ds), m)
        times = np.empty(m)
        clock = time.perf_counter
        for k, i in enumerate(pos.tolist()):
            t0 = clock()
            ds[i]
            times[k] = clock() - t0
        return 1.0 / float(times.mean()), m, f"median {statistics.median(times) * 1e6:.1f} us per call"
    if name == "memmap_prefetch":
        gen = classic.memmap_prefetch(lay, b, run.seed)
        try:
            return time_batches(gen, samples=m, warmup_batches=8).samples_per_s, m, ""
        finally:
            gen.close()
    if name == "classic_dl4":
        return _loader_rate(lambda: DataLoader(classic.MemmapDataset(lay), batch_size=b, shuffle=True, **RECIPE), m,
                            16), m, ""
    if name in ("classic_dl0", "file_read"):
        cls = classic.PreadDataset if name == "file_read" else classic.MemmapDataset
        return _loader_rate(lambda: DataLoader(cls(lay), batch_size=b, shuffle=True), m, 4), m, ""
    return _measure_qlib(name, run)


def _measure_qlib(name: str, run: BenchRun) -> tuple[float, int, str]:
    st = run.ds.store
    n_sym = min(QLIB_SYMBOLS, st.n_symbols)
    fidx = [st.fields.index(f) for f in run.fields]
    t0 = time.perf_counter()
    sampler = classic.qlib_sampler(np.asarray(st.panel[:n_sym][:, :, fidx]), st.dates, st.symbols[:n_sym],
                              run.fields, run.ds.window, st.dates[run.ds.window - 1])
    setup = f"{n_sym} symbols, set-up {time.perf_counter() - t0:.1f} s"
    m = run.per_sample
    if name == "qlib_getitem":
        pos = np.random.default_rng(run.seed).integers(0, len(sampler), m)
        times = np.empty(m)
        for k, i in enumerate(pos.tolist()):
            t1 = time.perf_counter()
            sampler[i]
            times[k] = time.perf_counter() - t1
        return 1.0 / float(times.mean()), m, f"median {statistics.median(times) * 1e6:.1f} us per call; {setup}"
    rate = _loader_rate(lambda: DataLoader(sampler, batch_size=run.batch_size, shuffle=True), m, 4)
    return rate, m, setup


__all__ = ["CLASSIC", "LABELS", "PER_SAMPLE", "QLIB_SYMBOLS", "RECIPE", "BenchRun", "VARIANTS", "ceiling", "measure",
           "memcpy_bandwidth"]
