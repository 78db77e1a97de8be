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

import os
import platform
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..feed.loader import describe_config
from ..system.cores import usable_cores
from ..progress import Progress
from ..samples.dataset import KlineDataset
from ..store import open_store
from . import classic
from . import footprint, synthetic
from .bench_report import BenchResult, BenchRow, format_table, plot
from .bench_rows import CLASSIC, LABELS, PER_SAMPLE, VARIANTS, BenchRun, ceiling, measure, memcpy_bandwidth

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
    layout = classic.WindowFile(st.data_file, st.manifest["data"]["rows"], st.date_capacity, st.n_fields, x_fields,
                                window, s, t)
    run = BenchRun(path, ds, ds.fields, batch_size, n, min(classic_samples, n), seed,
               torch.from_numpy(s * st.date_capacity + t - (window - 1)), layout)
    settings.update(fields=ds.fields, windows_in_store=len(ds), store_shape=[st.n_symbols, st.n_dates, st.n_fields],
                    loader=describe_config(ds.loader(batch_size=batch_size)))
    memory = "memory" in variants   # not a rate: measured in its own process, printed under the table
    variants = [v for v in variants if v != "memory"]
    if memory:   # first: before the rows' own mappings and threads share the machine with it
        settings["memory"] = footprint.measure(path, window, batch_size, fields=list(ds.fields)).as_dict()
    found: dict[str, list[tuple[float, int, str]]] = {}
    skipped: dict[str, str] = {}
    fast = [v for v in variants if v not in PER_SAMPLE]
    bar = Progress(rounds * len(fast) + len(variants) - len(fast), "bench", unit="runs")
    for r in range(rounds):
        for name in fast:
            found.setdefault(name, []).append(measure(name, run))
            bar.step(note=name)
            if r == rounds - 1 and progress is not None:
                progress(_row(name, found[name], samples))
    for name in (v for v in variants if v in PER_SAMPLE):
        if name.startswith("qlib") and not classic.qlib_available():
            skipped[name] = "skipped: pyqlib is not installed (pip install pyqlib)"
            continue
        found[name] = [measure(name, run)]
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


__all__ = ["BenchResult", "BenchRow", "CLASSIC", "VARIANTS", "bench", "ceiling", "format_table", "memcpy_bandwidth",
           "plot"]
