"""The classic table of loading methods, reproduced on the user's own store and machine.

Variants, all delivering the same shuffled windows ``[batch, window, fields]`` of float32:

* ``file_read``: plain file reading: each sample read from the data file into memory with ``os.pread``,
  per-sample Dataset under ``DataLoader(batch_size=B, shuffle=True, num_workers=0)``;
* ``memmap_dl4``: an ``np.memmap`` per-sample Dataset under the classic recipe ``DataLoader(batch_size=B,
  shuffle=True, num_workers=4, pin_memory=True, prefetch_factor=4, persistent_workers=True)``;
* ``memmap_dl0``: the same Dataset with ``num_workers=0``;
* ``memmap_prefetch``: memmap slices stacked into batches by a background thread (a queue 4 deep);
* ``kline_store``: ``KlineDataset(...).loader(batch_size=B, shuffle=True, device="cpu", config=...)``;

plus ``memcpy``: the machine's single-thread memory copy bandwidth, the ceiling for any loader.

The per-sample variants are slow, so they are measured on a fixed number of samples after a warm-up and
extrapolated to ``samples`` (the table says so); kline-store's loader is measured on all ``samples``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError

__all__ = ["BenchResult", "BenchRow", "VARIANTS", "bench", "format_table", "memcpy_bandwidth", "plot"]

VARIANTS = ("file_read", "memmap_dl4", "memmap_dl0", "memmap_prefetch", "kline_store")
CLASSIC = ("file_read", "memmap_dl4", "memmap_dl0", "memmap_prefetch")
LABELS = {
    "file_read": "file read per sample (os.pread), DataLoader workers=0",
    "memmap_dl4": "np.memmap Dataset, DataLoader workers=4 pin prefetch=4 persistent",
    "memmap_dl0": "np.memmap Dataset, DataLoader workers=0",
    "memmap_prefetch": "np.memmap batches + prefetch thread (queue 4)",
    "kline_store": "kline-store loader (device=cpu)",
    "memcpy": "memcpy ceiling (1 thread)",
}


@dataclasses.dataclass
class BenchRow:
    """One line of the table.

    Attributes:
        name: variant id (see ``VARIANTS``) or "memcpy".
        label: human description.
        samples_measured: samples actually timed.
        seconds_measured: seconds those samples took.
        samples_per_s: throughput.
        seconds_per_target: seconds for the target sample count (extrapolated when ``extrapolated``).
        extrapolated: True when measured on fewer samples than the target.
        bytes_per_s: bytes of ``x`` delivered per second.
        memcpy_fraction: ``bytes_per_s`` / memcpy bandwidth.
        ratio_to_best_classic: ``samples_per_s`` / that of the fastest classic variant.
    """

    name: str
    label: str
    samples_measured: int
    seconds_measured: float
    samples_per_s: float
    seconds_per_target: float
    extrapolated: bool
    bytes_per_s: float
    memcpy_fraction: float = 0.0
    ratio_to_best_classic: float = 0.0


@dataclasses.dataclass
class BenchResult:
    """The whole benchmark.

    Attributes:
        rows: one per variant, then the memcpy ceiling.
        memcpy_bytes_per_s: the ceiling.
        target_samples: the sample count the "seconds" column is for (1M by default).
        settings: store, window, fields, batch size, machine.
    """

    rows: list[BenchRow]
    memcpy_bytes_per_s: float
    target_samples: int
    settings: dict[str, Any]

    def row(self, name: str) -> BenchRow:
        """The row of one variant."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "settings": self.settings,
            "target_samples": self.target_samples,
            "memcpy_bytes_per_s": self.memcpy_bytes_per_s,
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }


# --------------------------------------------------------------------------- ceiling


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Single-thread memory copy bandwidth in bytes/s (bytes copied, best of ``repeats``).

    Both buffers are touched first so page faults do not count.
    """
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return src.nbytes / best


# --------------------------------------------------------------------------- classic variants


def _windows(first_bar: np.ndarray, last_bar: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(symbol, end date) of every window that lies within a symbol's listed span."""
    syms, ends = [], []
    for s, (a, b) in enumerate(zip(first_bar.tolist(), last_bar.tolist())):
        if a >= 0 and b - a + 1 >= window:
            t = np.arange(a + window - 1, b + 1, dtype=np.int64)
            syms.append(np.full(t.size, s, dtype=np.int64))
            ends.append(t)
    if not syms:
        raise InputError(f"bench: no symbol has {window} consecutive dates; use a smaller --window")
    return np.concatenate(syms), np.concatenate(ends)


class _Layout:
    """Where windows live in the data file; pickles as plain numbers so DataLoader workers reopen the file."""

    def __init__(self, data_file: Path, rows: int, capacity: int, n_fields: int, field_idx: list[int],
                 window: int, sym: np.ndarray, end: np.ndarray) -> None:
        self.data_file, self.rows, self.capacity, self.n_fields = str(data_file), rows, capacity, n_fields
        self.field_idx, self.window, self.sym, self.end = field_idx, window, sym, end
        self.contiguous = field_idx == list(range(field_idx[0], field_idx[0] + len(field_idx)))

    def __len__(self) -> int:
        return int(self.sym.size)

    def pick(self, rows: np.ndarray) -> np.ndarray:
        # rows: [window, n_fields] -> [window, selected fields]
        if self.contiguous:
            return rows[:, self.field_idx[0] : self.field_idx[0] + len(self.field_idx)]
        return rows[:, self.field_idx]


class MemmapDataset:
    """The classic per-sample Dataset over ``np.memmap`` (opened lazily in each worker)."""

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
        self._mm: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"layout": self.layout, "_mm": None}

    def __len__(self) -> int:
        return len(self.layout)

    def __getitem__(self, i: int) -> Any:
        import torch

        lay = self.layout
        if self._mm is None:
            self._mm = np.memmap(lay.data_file, dtype=np.float32, mode="r",
                                 shape=(lay.rows, lay.capacity, lay.n_fields))
        s, t = int(lay.sym[i]), int(lay.end[i])
        return torch.from_numpy(np.ascontiguousarray(lay.pick(self._mm[s, t - lay.window + 1 : t + 1])))


class PreadDataset:
    """Per-sample Dataset that reads each window from the file with ``os.pread`` (plain file reading)."""

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
        self._fd: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"layout": self.layout, "_fd": None}

    def __len__(self) -> int:
        return len(self.layout)

    def __getitem__(self, i: int) -> Any:
        import torch

        lay = self.layout
        if self._fd is None:
            self._fd = os.open(lay.data_file, os.O_RDONLY)
        s, t = int(lay.sym[i]), int(lay.end[i])
        offset = ((s * lay.capacity) + t - lay.window + 1) * lay.n_fields * 4
        buf = os.pread(self._fd, lay.window * lay.n_fields * 4, offset)
        rows = np.frombuffer(bytearray(buf), dtype=np.float32).reshape(lay.window, lay.n_fields)  # writable
        return torch.from_numpy(np.ascontiguousarray(lay.pick(rows)))

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


def _memmap_prefetch(layout: _Layout, batch_size: int, seed: int, depth: int = 4) -> Iterator[Any]:
    """Batches stacked from memmap slices in a background thread, ``depth`` batches ahead (endless epochs)."""
    import torch

    mm = np.memmap(layout.data_file, dtype=np.float32, mode="r",
                   shape=(layout.rows, layout.capacity, layout.n_fields))
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        rng = np.random.default_rng(seed)
        w = layout.window
        while not stop.is_set():
            perm = rng.permutation(len(layout))
            for k in range(0, perm.size, batch_size):
                ids = perm[k : k + batch_size]
                batch = np.stack([layout.pick(mm[s, t - w + 1 : t + 1])
                                  for s, t in zip(layout.sym[ids].tolist(), layout.end[ids].tolist())])
                while not stop.is_set():
                    try:
                        q.put(torch.from_numpy(batch), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return

    th = threading.Thread(target=produce, name="bench-memmap-prefetch", daemon=True)
    th.start()
    try:
        while True:
            yield q.get()
    finally:
        stop.set()
        th.join(timeout=5)


def _endless(make: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    """Epoch after epoch of a re-iterable loader."""
    while True:
        empty = True
        for batch in make():
            empty = False
            yield batch
        if empty:
            raise InputError("bench: the loader yielded no batch; the store is too small for this window/batch")


def _time_stream(stream: Iterator[Any], samples: int, warmup_batches: int) -> tuple[int, float]:
    """Consume warm-up batches, then time batches until ``samples`` samples; returns (samples, seconds)."""
    from .meter import batch_length

    for _ in range(warmup_batches):
        next(stream)
    n = 0
    t0 = time.perf_counter()
    while n < samples:
        n += batch_length(next(stream))
    return n, time.perf_counter() - t0


# --------------------------------------------------------------------------- driver


def bench(
    store: str | os.PathLike,
    *,
    window: int = 64,
    fields: Sequence[str] | None = None,
    batch_size: int = 256,
    samples: int = 1_000_000,
    classic_samples: int = 20_000,
    variants: Sequence[str] = VARIANTS,
    seed: int = 0,
    config: str | dict[str, Any] | None = "auto",
    progress: Callable[[BenchRow], None] | None = None,
) -> BenchResult:
    """Run the loading-method comparison on a store.

    Args:
        store: the store directory.
        window: window length.
        fields: fields per window; None takes the first 6 of the store (OHLCV and the next one).
        batch_size: batch size of every variant.
        samples: the target sample count ("seconds for 1M samples"); kline-store's loader runs all of it.
        classic_samples: samples timed for each classic variant, after warm-up (extrapolated to ``samples``).
        variants: which variants to run (any of ``VARIANTS``).
        seed: shuffling seed.
        config: loader config for kline-store ("auto": the tuned one if any; see ``kline_store.tune``).
        progress: called with each row as soon as it is measured.

    Returns:
        A ``BenchResult`` with a memcpy row last.

    Raises:
        InputError: unknown variant, bad sizes, unknown field.
    """
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise InputError(f"bench: unknown variant(s) {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if window < 1 or batch_size < 1 or samples < 1 or classic_samples < 1:
        raise InputError("bench: window, batch size, samples and classic samples must all be >= 1")
    import torch

    from .store import open_store

    st = open_store(store, verify=False)
    try:
        names = list(fields) if fields else st.fields[:6]
        field_idx = [st.field_index(f) for f in names]
        sym, end = _windows(st.first_bar, st.last_bar, window)
        rows_in_file = os.path.getsize(st.data_file) // (st.row_stride * 4)
        layout = _Layout(st.data_file, rows_in_file, st.date_capacity, st.n_fields, field_idx, window, sym, end)
        settings = {
            "store": str(Path(store)), "window": window, "fields": names, "batch_size": batch_size,
            "windows_in_store": len(layout), "cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__,
            "classic_samples": classic_samples,
        }
    finally:
        st.close()
    sample_bytes = window * len(field_idx) * 4
    from .tune import load_config, resolve_config

    tuned = load_config(store, window, batch_size, "cpu") if config == "auto" else None
    loader_config = tuned or resolve_config(None if config == "auto" else config, store, window, batch_size, "cpu")
    settings["kline_store_config"] = loader_config
    settings["kline_store_config_source"] = "tuned" if tuned else ("default" if config in (None, "auto") else "given")
    labels = dict(LABELS)
    if "kline_store" in variants:
        from .dataset import KlineDataset

        probe = KlineDataset(store, window=window, fields=names)
        settings["kline_store_placement"] = placement = probe.loader(batch_size=batch_size, device="cpu",
                                                                     config=loader_config).placement
        labels["kline_store"] = (f"kline-store loader (device=cpu, placement {placement}, "
                                 f"{loader_config['backend']} x{loader_config['num_workers']}, "
                                 f"prefetch {loader_config['prefetch']})")

    rows: list[BenchRow] = []
    for name in variants:
        target = samples if name == "kline_store" else min(classic_samples, samples)
        n, secs = _run_variant(name, store, layout, names, batch_size, target, seed, loader_config)
        rate = n / secs if secs > 0 else float("inf")
        row = BenchRow(name, labels[name], n, secs, rate, samples / rate, n < samples, rate * sample_bytes)
        rows.append(row)
        if progress is not None:
            progress(row)
    ceiling = memcpy_bandwidth()
    rows.append(BenchRow("memcpy", LABELS["memcpy"], 0, 0.0, ceiling / sample_bytes,
                         samples * sample_bytes / ceiling, False, ceiling))
    best_classic = max((r.samples_per_s for r in rows if r.name in CLASSIC), default=0.0)
    for r in rows:
        r.memcpy_fraction = r.bytes_per_s / ceiling
        r.ratio_to_best_classic = r.samples_per_s / best_classic if best_classic else 0.0
    return BenchResult(rows, ceiling, samples, settings)


def _run_variant(name: str, store: str | os.PathLike, layout: _Layout, fields: list[str], batch_size: int,
                 samples: int, seed: int, config: Any) -> tuple[int, float]:
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        # pin_memory=True without CUDA warns once per loader; the classic recipe passes it regardless.
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        # and 4 workers on fewer cores warn too: the recipe is reproduced as people run it
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        if name == "kline_store":
            from .dataset import KlineDataset

            ds = KlineDataset(store, window=layout.window, fields=fields)
            loader = ds.loader(batch_size=batch_size, shuffle=True, seed=seed, device="cpu", config=config)
            return _time_stream(_endless(lambda: loader), samples, warmup_batches=8)  # epoch after epoch
        if name == "memmap_prefetch":
            gen = _memmap_prefetch(layout, batch_size, seed)
            try:
                return _time_stream(gen, samples, warmup_batches=8)
            finally:
                gen.close()
        if name == "memmap_dl4":
            dl = DataLoader(MemmapDataset(layout), batch_size=batch_size, shuffle=True, num_workers=4,
                            pin_memory=True, prefetch_factor=4, persistent_workers=True)
            stream = _endless(lambda: dl)
            try:
                return _time_stream(stream, samples, warmup_batches=16)  # 4 workers x 4 batches in flight
            finally:
                stream.close()
                it = getattr(dl, "_iterator", None)
                if it is not None:
                    it._shutdown_workers()
        ds_cls = PreadDataset if name == "file_read" else MemmapDataset
        dl = DataLoader(ds_cls(layout), batch_size=batch_size, shuffle=True, num_workers=0)
        return _time_stream(_endless(lambda: dl), samples, warmup_batches=4)


# --------------------------------------------------------------------------- output


def format_table(result: BenchResult) -> str:
    """The table as text, with a note on extrapolation."""
    m = result.target_samples
    head = f"{'variant':<18}{'samples/s':>14}{f's/{_short(m)}':>11}{'x best classic':>16}{'of memcpy':>11}  method"
    lines = [head, "-" * len(head)]
    for r in result.rows:
        secs = f"{r.seconds_per_target:.2f}" + ("*" if r.extrapolated else "")
        ratio = f"{r.ratio_to_best_classic:.1f}x" if r.name != "memcpy" and r.ratio_to_best_classic else "-"
        lines.append(
            f"{r.name:<18}{r.samples_per_s:>14,.0f}{secs:>11}{ratio:>16}{100 * r.memcpy_fraction:>10.1f}%  {r.label}"
        )
    s = result.settings
    note = (f"* measured on {s['classic_samples']:,} samples after warm-up and extrapolated to {m:,}. "
            if any(r.extrapolated for r in result.rows) else "")
    lines.append("")
    lines.append(
        f"{note}window={s['window']} fields={len(s['fields'])} batch={s['batch_size']} cpus={s['cpus']}; "
        f"memcpy {result.memcpy_bytes_per_s / 1e9:.1f} GB/s"
    )
    if s.get("kline_store_config_source") == "default" and any(r.name == "kline_store" for r in result.rows):
        lines.append(f"kline-store used the default loader config; `kline-store tune {s['store']} "
                     f"--window {s['window']} --batch-size {s['batch_size']}` saves a tuned one for this machine")
    return "\n".join(lines)


def _short(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def plot(result: BenchResult, path: str | os.PathLike) -> Path:
    """Write a horizontal bar chart of samples/s (log scale) to a PNG.

    Raises:
        InputError: matplotlib is not installed (``pip install 'kline-store[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'kline-store[plot]'") from None
    rows = result.rows
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.5))
    colors = ["#888888" if r.name in CLASSIC else "#1f77b4" if r.name == "kline_store" else "#2ca02c" for r in rows]
    ax.barh([r.name for r in rows], [r.samples_per_s for r in rows], color=colors)
    ax.set_xscale("log")
    ax.invert_yaxis()
    for i, r in enumerate(rows):
        ax.text(r.samples_per_s, i, f" {r.samples_per_s:,.0f}/s ({100 * r.memcpy_fraction:.0f}% memcpy)",
                va="center", fontsize=8)
    s = result.settings
    ax.set_xlabel("samples per second (log scale)")
    ax.set_title(f"window {s['window']} x {len(s['fields'])} fields, batch {s['batch_size']}, {s['cpus']} cpus")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
