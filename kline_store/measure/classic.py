"""The loading recipes kline-store is compared with, built over the same store file and the same windows.

* ``MemmapDataset``: the classic per-sample ``np.memmap`` Dataset (a slice per ``__getitem__``), the one tutorials
  put under ``DataLoader(num_workers=4, pin_memory=True, prefetch_factor=4, persistent_workers=True)``;
* ``PreadDataset``: plain file reading, one ``os.pread`` per sample;
* ``memmap_prefetch``: memmap slices stacked into batches by a background thread;
* ``qlib_sampler``: Qlib's ``TSDataSampler`` over the same bars, when pyqlib is installed.

Each pickles as plain numbers and reopens the file in DataLoader workers.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch


class WindowFile:
    """Where the windows live in the data file: file, shape, fields, window length, and each window's end cell."""

    def __init__(self, data_file: Path, rows: int, capacity: int, n_fields: int, field_idx: list[int],
                 window: int, sym: np.ndarray, end: np.ndarray) -> None:
        self.data_file, self.rows, self.capacity, self.n_fields = str(data_file), rows, capacity, n_fields
        self.field_idx, self.window, self.sym, self.end = field_idx, window, sym, end
        self.contiguous = field_idx == list(range(field_idx[0], field_idx[0] + len(field_idx)))

    def __len__(self) -> int:
        return int(self.sym.size)

    def pick(self, rows: np.ndarray) -> np.ndarray:
        """``[window, n_fields]`` rows -> ``[window, selected fields]``."""
        if self.contiguous:
            return rows[:, self.field_idx[0]: self.field_idx[0] + len(self.field_idx)]
        return rows[:, self.field_idx]

    def memmap(self) -> np.ndarray:
        return np.memmap(self.data_file, dtype=np.float32, mode="r", shape=(self.rows, self.capacity, self.n_fields))


class MemmapDataset(torch.utils.data.Dataset):
    """The classic per-sample Dataset over ``np.memmap`` (opened lazily in each worker)."""

    def __init__(self, layout: WindowFile) -> None:
        self.layout = layout
        self._mm: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"layout": self.layout, "_mm": None}

    def __len__(self) -> int:
        return len(self.layout)

    def __getitem__(self, i: int) -> torch.Tensor:
        lay = self.layout
        if self._mm is None:
            self._mm = lay.memmap()
        s, t = int(lay.sym[i]), int(lay.end[i])
        return torch.from_numpy(np.array(lay.pick(self._mm[s, t - lay.window + 1: t + 1])))  # a copy, as usual


class PreadDataset(torch.utils.data.Dataset):
    """Per-sample Dataset that reads each window from the file with ``os.pread`` (plain file reading)."""

    def __init__(self, layout: WindowFile) -> None:
        self.layout = layout
        self._fd: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"layout": self.layout, "_fd": None}

    def __len__(self) -> int:
        return len(self.layout)

    def __getitem__(self, i: int) -> torch.Tensor:
        lay = self.layout
        if self._fd is None:
            self._fd = os.open(lay.data_file, os.O_RDONLY)
        s, t = int(lay.sym[i]), int(lay.end[i])
        offset = ((s * lay.capacity) + t - lay.window + 1) * lay.n_fields * 4
        buf = os.pread(self._fd, lay.window * lay.n_fields * 4, offset)
        rows = np.frombuffer(bytearray(buf), dtype=np.float32).reshape(lay.window, lay.n_fields)  # writable
        return torch.from_numpy(np.ascontiguousarray(lay.pick(rows)))

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)  # type: ignore[arg-type]


def memmap_prefetch(layout: WindowFile, batch_size: int, seed: int, depth: int = 4) -> Iterator[torch.Tensor]:
    """Batches stacked from memmap slices in a background thread, ``depth`` batches ahead (endless epochs)."""
    mm = layout.memmap()
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        rng = np.random.default_rng(seed)
        w = layout.window
        while not stop.is_set():
            perm = rng.permutation(len(layout))
            for k in range(0, perm.size, batch_size):
                ids = perm[k: k + batch_size]
                batch = np.stack([layout.pick(mm[s, t - w + 1: t + 1])
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


def qlib_available() -> bool:
    """Whether pyqlib's TSDataSampler can be imported (it is not a kline-store dependency)."""
    try:
        from qlib.data.dataset import TSDataSampler  # noqa: F401
    except Exception:   # missing, or a broken install: the row is skipped with a note
        return False
    return True


def qlib_sampler(panel: np.ndarray, dates: np.ndarray, symbols: list[str], fields: list[str], window: int,
                 start: np.datetime64) -> Any:
    """Qlib's ``TSDataSampler`` over the same bars: a ``<datetime, instrument>`` frame of every bar, windows of
    ``window`` rows ending on or after ``start`` (Qlib's own indexing, NaN rows where a symbol has no bar)."""
    import pandas as pd
    from qlib.data.dataset import TSDataSampler

    ok = np.isfinite(panel).all(axis=2)
    s_idx, d_idx = np.nonzero(ok)
    index = pd.MultiIndex.from_arrays([pd.DatetimeIndex(dates[d_idx]), np.asarray(symbols, dtype=object)[s_idx]],
                                      names=["datetime", "instrument"])
    frame = pd.DataFrame(panel[s_idx, d_idx], index=index, columns=fields).sort_index()
    return TSDataSampler(frame, pd.Timestamp(start), pd.Timestamp(dates[-1]), step_len=window,
                         dtype=np.float32)
