"""`kline-store bench`: every way users drive a loader, against the ceiling, on a store bigger than the CPU cache.

All rows gather the same shuffled windows (a dataset's valid windows, ``window`` days of the same fields) from the
same store file, in one run:

* ``ceiling``: a bare ``torch.index_select`` of those windows from the mapped panel, pages resident: the best of
  one call per batch with torch's threads, one call per batch on one thread, and chunks gathered in as many threads
  as there are cores; ``ceiling_first_touch``: one call per batch on the first pass over a fresh mapping;
* kline-store's loader as users drive it: ``ds.loader()`` with defaults, its first epoch after opening the store,
  ``num_workers=0`` and ``2``, the classic recipe's keywords, worker processes;
* a plain ``torch.utils.data.DataLoader(ds, ...)`` (0 and 2 workers, and the classic recipe), and ``ds[i]``;
* the classic recipes without kline-store (``classic.py``) and, when pyqlib is installed, Qlib's TSDataSampler;
* ``memcpy``: single-thread copy bandwidth.

Fast rows are measured ``rounds`` times, interleaved, and the best round is reported with the spread (the
machine's noise is visible, not averaged away); per-sample rows are timed on ``classic_samples`` samples and
extrapolated. A store smaller than ``4 x L3`` is replaced by a synthetic one that size, and the table says so.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import platform
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from . import classic as CL
from . import synthetic
from ..samples.dataset import KlineDataset
from ..errors import InputError
from ..samples.gather import window_view
from ..feed.loader import describe_config
from ..feed.placement import readahead, usable_cores
from ..progress import Progress
from ..feed.prefetch import KeepTorchThreads, SingleThreaded, single_threaded_torch
from ..store import open_store
from .timing import shut_down, time_batches

RECIPE = {"num_workers": 4, "pin_memory": True, "prefetch_factor": 4, "persistent_workers": True}
VARIANTS = ("ceiling", "ceiling_first_touch", "kline_store", "later_epoch", "first_epoch", "workers_0", "workers_2",
            "recipe_kwargs", "processes_2", "dataloader", "dataloader_2", "dataloader_recipe", "getitem",
            "classic_dl4", "classic_dl0", "file_read", "memmap_prefetch", "qlib_dataloader", "qlib_getitem")
CLASSIC = ("classic_dl4", "classic_dl0", "file_read", "memmap_prefetch")
PER_SAMPLE = ("getitem", "classic_dl4", "classic_dl0", "file_read", "memmap_prefetch", "qlib_dataloader",
              "qlib_getitem")
LABELS = {
    "ceiling": "bare index_select of the same windows, pages resident (best method)",
    "ceiling_first_touch": "bare index_select per batch, first pass over a fresh mapping",
    "kline_store": "ds.loader(batch_size=B, shuffle=True)",
    "later_epoch": "ds.loader(...) a whole later epoch of a loader in use (its next shuffle included)",
    "first_epoch": "ds.loader(...) whole first epoch after opening the store, its shuffle included",
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
}
QLIB_SYMBOLS = 200   # Qlib's sampler copies the bars into pandas first: a subset keeps its set-up bounded


@dataclasses.dataclass
class BenchRow:
    """One line of the table.

    Attributes:
        name: variant id (see ``VARIANTS``) or "memcpy".
        label: what was run.
        samples_per_s: windows per second (the best round).
        spread: (slowest, fastest) round.
        samples_measured: windows timed per round.
        extrapolated: timed on fewer windows than the target.
        seconds_per_target: seconds for the target window count at this rate.
        of_ceiling: the median over rounds of this row's rate / the ceiling measured in the same round (rows
            measured once: their rate / the best ceiling). Per-round ratios keep a machine whose speed drifts
            between rounds from skewing the comparison.
        x_best_classic: ``samples_per_s`` / that of the fastest classic recipe.
        note: how (the ceiling's method, the per-call median of ``ds[i]``, why a row was skipped).
        skipped: not measured (e.g. pyqlib missing).
    """

    name: str
    label: str
    samples_per_s: float = 0.0
    spread: tuple[float, float] = (0.0, 0.0)
    samples_measured: int = 0
    extrapolated: bool = False
    seconds_per_target: float = 0.0
    of_ceiling: float = 0.0
    x_best_classic: float = 0.0
    note: str = ""
    skipped: bool = False


@dataclasses.dataclass
class BenchResult:
    """The table and how it was measured (store, sizes, machine)."""

    rows: list[BenchRow]
    settings: dict[str, Any]

    def row(self, name: str) -> BenchRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "rows": [dataclasses.asdict(r) for r in self.rows]}


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
    th = readahead(flat, available=1 << 62)
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
class _Run:
    """What every variant reads: the store, the dataset, the windows, the sizes."""

    store: Path
    ds: KlineDataset
    fields: list[str]
    batch_size: int
    n: int
    per_sample: int
    seed: int
    start: torch.Tensor
    layout: CL.Layout


def _loader_rate(make: Callable[[], Any], n: int, warmup: int) -> float:
    src = make()
    try:
        return time_batches(src, samples=n, warmup_batches=warmup).samples_per_s
    finally:
        shut_down(src)
        del src
        gc.collect()


def _measure(name: str, run: _Run) -> tuple[float, int, str]:
    """``(windows/s, windows timed, note)`` of one variant, once."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")       # pinning without CUDA: the recipe asks
        warnings.filterwarnings("ignore", message="This DataLoader will create")   # 4 workers on fewer cores
        return _measure_loud(name, run)


def _measure_loud(name: str, run: _Run) -> tuple[float, int, str]:
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


def _measure_per_sample(name: str, run: _Run) -> tuple[float, int, str]:
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
        gen = CL.memmap_prefetch(lay, b, run.seed)
        try:
            return time_batches(gen, samples=m, warmup_batches=8).samples_per_s, m, ""
        finally:
            gen.close()
    if name == "classic_dl4":
        return _loader_rate(lambda: DataLoader(CL.MemmapDataset(lay), batch_size=b, shuffle=True, **RECIPE), m,
                            16), m, ""
    if name in ("classic_dl0", "file_read"):
        cls = CL.PreadDataset if name == "file_read" else CL.MemmapDataset
        return _loader_rate(lambda: DataLoader(cls(lay), batch_size=b, shuffle=True), m, 4), m, ""
    return _measure_qlib(name, run)


def _measure_qlib(name: str, run: _Run) -> tuple[float, int, str]:
    st = run.ds.store
    n_sym = min(QLIB_SYMBOLS, st.n_symbols)
    fidx = [st.fields.index(f) for f in run.fields]
    t0 = time.perf_counter()
    sampler = CL.qlib_sampler(np.asarray(st.panel[:n_sym][:, :, fidx]), st.dates, st.symbols[:n_sym],
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


# --------------------------------------------------------------------------- driver


def _prepare_store(store: str | os.PathLike, window: int, min_multiple: float, scratch: Path | None,
                   settings: dict[str, Any], say: Callable[[str], None]) -> Path:
    """The store to measure on: the user's when it is at least ``min_multiple`` x L3, else a synthetic one."""
    path = Path(store)
    l3 = synthetic.l3_bytes()
    with open_store(path, verify=False) as st:
        nbytes = st.logical_bytes
    settings.update(l3_bytes=l3, user_store=str(path), user_store_bytes=nbytes)
    if nbytes >= min_multiple * l3:
        settings.update(store=str(path), store_bytes=nbytes, synthetic=False)
        return path
    n_sym, n_dates, n_fields = synthetic.shape_for(int(min_multiple * l3 * 1.05), max(2500, 4 * window))
    out = Path(tempfile.mkdtemp(prefix="kline-bench-", dir=scratch))
    say(f"{path} is {nbytes / 2**20:.1f} MiB, smaller than {min_multiple:g} x the L3 cache ({l3 / 2**20:.0f} MiB): "
        f"measuring on a synthetic store of {n_sym} symbols x {n_dates} days x {n_fields} fields in {out}")
    synthetic.make_store(out / "store", n_sym, n_dates)
    settings.update(store=str(out / "store"), store_bytes=n_sym * n_dates * n_fields * 4, synthetic=True)
    return out / "store"


def bench(store: str | os.PathLike, *, window: int = 64, fields: Sequence[str] | None = None,
          batch_size: int = 256, samples: int = 1_000_000, classic_samples: int = 20_000, rounds: int = 3,
          variants: Sequence[str] = VARIANTS, seed: int = 0, min_cache_multiple: float = 4.0,
          scratch: str | os.PathLike | None = None, progress: Callable[[BenchRow], None] | None = None,
          say: Callable[[str], None] = lambda s: None) -> BenchResult:
    """Measure every variant on a store at least ``min_cache_multiple`` x the L3 cache.

    Args:
        store: the store directory (a synthetic store is made, and removed afterwards, when it is smaller).
        window: window length.
        fields: fields per window (default: the dataset default, OHLCV and amount).
        batch_size: batch size of every variant.
        samples: windows timed per fast row (and the target count the "seconds" column is for).
        classic_samples: windows timed per per-sample row (extrapolated).
        rounds: repetitions of the fast rows, interleaved; the best is reported with the spread.
        variants: which rows (any of ``VARIANTS``); the memcpy row is always added.
        seed: shuffling seed.
        min_cache_multiple: the store must be at least this many times the L3 cache.
        scratch: folder for the synthetic store (default: the system temp folder).
        progress: called with each row as it is finished.
        say: called with notes (the synthetic store).

    Raises:
        InputError: unknown variant, bad sizes, unknown field.
    """
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise InputError(f"bench: unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if min(window, batch_size, samples, classic_samples, rounds) < 1:
        raise InputError("bench: window, batch size, samples, classic samples and rounds must all be >= 1")
    settings: dict[str, Any] = {
        "window": window, "batch_size": batch_size, "samples": samples, "classic_samples": classic_samples,
        "rounds": rounds, "cpus": usable_cores(), "machine": platform.machine(),
        "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "load_before": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    path = _prepare_store(store, window, min_cache_multiple, Path(scratch) if scratch else None, settings, say)
    try:
        return _bench(path, window, fields, batch_size, samples, classic_samples, rounds, list(variants), seed,
                      settings, progress)
    finally:
        if settings["synthetic"]:
            import shutil

            shutil.rmtree(path.parent, ignore_errors=True)


def _bench(path: Path, window: int, fields: Sequence[str] | None, batch_size: int, samples: int,
           classic_samples: int, rounds: int, variants: list[str], seed: int, settings: dict[str, Any],
           progress: Callable[[BenchRow], None] | None) -> BenchResult:
    ds = KlineDataset(path, window=window, fields=list(fields) if fields else None)
    st = ds.store
    n = min(samples, len(ds))
    order = np.random.default_rng(seed).permutation(len(ds))[:n]
    s, t = ds.locate(order)
    x_fields = [st.fields.index(f) for f in ds.fields]
    layout = CL.Layout(st.data_file, st.manifest["data"]["rows"], st.date_capacity, st.n_fields, x_fields, window,
                       s, t)
    run = _Run(path, ds, ds.fields, batch_size, n, min(classic_samples, n), seed,
               torch.from_numpy(s * st.date_capacity + t - (window - 1)), layout)
    settings.update(fields=ds.fields, windows_in_store=len(ds), store_shape=[st.n_symbols, st.n_dates, st.n_fields],
                    loader=describe_config(ds.loader(batch_size=batch_size)))
    found: dict[str, list[tuple[float, int, str]]] = {}
    skipped: dict[str, str] = {}
    fast = [v for v in variants if v not in PER_SAMPLE]
    bar = Progress(rounds * len(fast) + len(variants) - len(fast), "bench", unit="runs")
    for r in range(rounds):
        for name in fast:
            found.setdefault(name, []).append(_measure(name, run))
            bar.step(note=name)
            if r == rounds - 1 and progress is not None:
                progress(_row(name, found[name], samples))
    for name in (v for v in variants if v in PER_SAMPLE):
        if name.startswith("qlib") and not CL.qlib_available():
            skipped[name] = "skipped: pyqlib is not installed (pip install pyqlib)"
            continue
        found[name] = [_measure(name, run)]
        bar.step(note=name)
        if progress is not None:
            progress(_row(name, found[name], samples))
    bar.close()
    sample_bytes = window * len(ds.fields) * 4
    found["memcpy"] = [(memcpy_bandwidth() / sample_bytes, 0, "")]
    rows = [_row(name, found[name], samples) if name in found else
            BenchRow(name, LABELS[name], note=skipped[name], skipped=True) for name in [*variants, "memcpy"]]
    top = next((r.samples_per_s for r in rows if r.name == "ceiling"), 0.0)
    per_round = [rate for rate, _, _ in found.get("ceiling", [])]
    best_classic = max((r.samples_per_s for r in rows if r.name in CLASSIC), default=0.0)
    for r in rows:
        runs = [rate for rate, _, _ in found.get(r.name, [])]
        if len(per_round) > 1 and len(runs) == len(per_round):
            r.of_ceiling = float(np.median([a / c for a, c in zip(runs, per_round)]))
        else:
            r.of_ceiling = r.samples_per_s / top if top else 0.0
        r.x_best_classic = r.samples_per_s / best_classic if best_classic else 0.0
    settings["load_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return BenchResult(rows, settings)


def _row(name: str, runs: list[tuple[float, int, str]], target: int) -> BenchRow:
    rates = [r for r, _, _ in runs]
    best = max(range(len(runs)), key=lambda k: rates[k])
    rate, measured, note = runs[best]
    extrapolated = name in PER_SAMPLE or (0 < measured < target)
    return BenchRow(name, LABELS[name], rate, (min(rates), max(rates)), measured, extrapolated,
                    target / rate if rate > 0 else float("inf"), note=note)


# --------------------------------------------------------------------------- output


def format_table(result: BenchResult) -> str:
    """The table as text, with the store, cache and machine it was measured on."""
    s = result.settings
    m = s["samples"]
    head = (f"{'variant':<20}{'windows/s':>13}{'spread':>20}{f's/{_short(m)}':>9}{'of ceiling':>12}"
            f"{'x classic':>11}  how")
    lines = [head, "-" * len(head)]
    for r in result.rows:
        if r.skipped:
            lines.append(f"{r.name:<20}{'-':>13}{'':>20}{'':>9}{'':>12}{'':>11}  {r.label} [{r.note}]")
            continue
        spread = f"{r.spread[0]:,.0f}-{r.spread[1]:,.0f}" if r.spread[0] != r.spread[1] else ""
        secs = f"{r.seconds_per_target:.2f}" + ("*" if r.extrapolated else "")
        ratio = f"{r.x_best_classic:.1f}x" if r.x_best_classic and r.name != "memcpy" else "-"
        note = f" [{r.note}]" if r.note else ""
        lines.append(f"{r.name:<20}{r.samples_per_s:>13,.0f}{spread:>20}{secs:>9}{100 * r.of_ceiling:>11.0f}%"
                     f"{ratio:>11}  {r.label}{note}")
    store = (f"synthetic store {s['store_bytes'] / 2**20:.0f} MiB (yours: {s['user_store_bytes'] / 2**20:.1f} MiB)"
             if s.get("synthetic") else f"store {s['store_bytes'] / 2**20:.0f} MiB")
    lines += ["", f"{store}, {s['store_bytes'] / s['l3_bytes']:.1f} x L3 ({s['l3_bytes'] / 2**20:.0f} MiB); "
                  f"{s['windows_in_store']:,} windows of {s['window']} days x {len(s['fields'])} fields; batch "
                  f"{s['batch_size']}; {s['cpus']} cpus; best of {s['rounds']} rounds (spread shown); "
                  f"load {s['load_before']:.2f} -> {s['load_after']:.2f}",
              f"kline-store loader defaults here: {s['loader']}",
              f"* timed on fewer windows ({s['classic_samples']:,} per-sample, or half for slow loaders) and "
              f"extrapolated to {m:,}"]
    return "\n".join(lines)


def _short(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def plot(result: BenchResult, path: str | os.PathLike) -> Path:
    """A horizontal bar chart of windows/s (log scale) to a PNG.

    Raises:
        InputError: matplotlib is not installed (``pip install 'kline-store[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'kline-store[plot]'") from None
    rows = [r for r in result.rows if not r.skipped]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    colors = ["#888888" if r.name in CLASSIC or r.name.startswith("qlib") else
              "#2ca02c" if r.name.startswith("ceiling") or r.name == "memcpy" else "#1f77b4" for r in rows]
    ax.barh([r.name for r in rows], [r.samples_per_s for r in rows], color=colors)
    ax.set_xscale("log")
    ax.invert_yaxis()
    for i, r in enumerate(rows):
        ax.text(r.samples_per_s, i, f" {r.samples_per_s:,.0f}/s ({100 * r.of_ceiling:.0f}% of ceiling)",
                va="center", fontsize=8)
    s = result.settings
    ax.set_xlabel("windows per second (log scale)")
    ax.set_title(f"window {s['window']} x {len(s['fields'])} fields, batch {s['batch_size']}, {s['cpus']} cpus, "
                 f"store {s['store_bytes'] / 2**20:.0f} MiB")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = ["BenchResult", "BenchRow", "CLASSIC", "VARIANTS", "bench", "format_table", "memcpy_bandwidth", "plot"]
