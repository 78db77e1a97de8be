"""CrossSectionDataset: one item per day with every symbol's valid window, for ranking and IC losses.

Items are grouped from a KlineDataset's valid-window index (``windows.by_day``); a batch of days is padded to its
largest day with a ``mask``, gathered in one call over all its windows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import windows as W
from ..feed.collate import GatheredBatch
from .dataset import KlineDataset, position
from .ranges import DateLike
from ..errors import InputError
from ..feed.loader import KlineLoader
from ..store import Store


class CrossSectionDataset(torch.utils.data.Dataset):
    """One item per calendar day with at least ``min_count`` valid windows: all of that day's windows.

    Item: ``x`` ``[n, window, n_fields]``, ``y`` ``[n]``, ``symbol`` ``[n]`` int64, ``t`` int. Batches from
    :meth:`loader` stack days with padding: ``x`` ``[B, n_max, window, n_fields]``, ``y`` ``[B, n_max]`` (0 in
    padding), ``symbol`` ``[B, n_max]`` (-1 in padding), ``mask`` bool ``[B, n_max]``, ``t`` ``[B]``.

    Args: as :class:`KlineDataset` (``path``, ``window``, ``fields``, ``horizon``, ``start``, ``end`` and the
    keyword options), plus ``min_count``: fewest windows a day needs to be an item. ``path`` may also be a
    KlineDataset, whose windows are grouped (its own parameters apply; pass no others).
    """

    def __init__(self, path: str | os.PathLike | Store | KlineDataset, window: int = 64,
                 fields: Sequence[str] | None = None,
                 horizon: int | None = None, start: DateLike = None, end: DateLike = None, *, min_count: int = 1,
                 **options: Any) -> None:
        super().__init__()
        if isinstance(path, KlineDataset):
            if options or fields is not None or start is not None or end is not None:
                raise InputError("CrossSectionDataset(KlineDataset, ...): the dataset's own parameters apply; "
                                 "pass a store path to set others")
            self.windows = path
        else:
            self.windows = KlineDataset(path, window, fields, horizon, start, end, **options)
        self.min_count = int(min_count)
        self._build()
        if len(self._days) == 0:
            raise InputError(f"{self.windows.path}: no day has {self.min_count} or more valid windows")

    def _build(self) -> None:
        st = self.windows.store
        days, offsets, order = W.by_day(self.windows.valid_index(), st.n_symbols, st.n_dates)
        keep = np.diff(offsets) >= self.min_count
        if not keep.all():
            counts = np.diff(offsets)[keep]
            order = np.concatenate([order[a:b] for a, b in zip(offsets[:-1][keep], offsets[1:][keep])]) \
                if keep.any() else order[:0]
            offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
            days = days[keep]
        self._days, self._offsets, self._order = days, offsets, order

    def __getstate__(self) -> dict[str, Any]:
        return {"windows": self.windows, "min_count": self.min_count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.windows = state["windows"]
        self.min_count = state["min_count"]
        self._days = None  # type: ignore[assignment]

    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._days is None:
            self._build()
        return self._days, self._offsets, self._order

    def __len__(self) -> int:
        return len(self._tables()[0])

    @property
    def path(self) -> Path:
        return self.windows.path

    @property
    def store(self) -> Store:
        return self.windows.store

    @property
    def window(self) -> int:
        return self.windows.window

    @property
    def fields(self) -> list[str]:
        return self.windows.fields

    @property
    def days(self) -> np.ndarray:
        """Calendar index of each item's day."""
        return self._tables()[0]

    @property
    def stats(self) -> dict[str, Any] | None:
        return self.windows.stats

    def day_windows(self, i: int) -> np.ndarray:
        """Flat cell indices of day item ``i``'s windows (sorted by symbol)."""
        _, off, order = self._tables()
        return order[off[i]: off[i + 1]]

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = position(i, len(self), "day")
        b = self.windows.gather_flat(self.day_windows(i))
        b["t"] = int(self._tables()[0][i])  # type: ignore[assignment]
        return b

    def gather_batch(self, indices: np.ndarray | Sequence[int] | torch.Tensor,
                     out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Days ``indices`` padded to the largest: one gather for all their windows (padding slots re-read the
        first window, then are cleared)."""
        days, off, order = self._tables()
        idx = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(days)):
            raise IndexError(f"day index out of range [0, {len(days)})")
        b = len(idx)
        counts = off[idx + 1] - off[idx]
        n_max = int(counts.max()) if b else 0
        slot = np.arange(n_max)[None, :]
        mask = slot < counts[:, None]
        src = np.where(mask, off[idx][:, None] + slot, off[idx][:, None])  # padding -> the day's first window
        flat = order[src.reshape(-1)]
        g = self.windows.gather_flat(flat)
        pad = torch.from_numpy(np.flatnonzero(~mask.reshape(-1)))
        res: dict[str, torch.Tensor] = {}
        for k, v in g.items():
            if k == "t":
                continue
            if len(pad):
                v.index_fill_(0, pad, -1 if k == "symbol" else 0)
            res[k] = v.view(b, n_max, *v.shape[1:])
        res["t"] = torch.from_numpy(days[idx].copy())
        res["mask"] = torch.from_numpy(mask)
        if out is not None:
            for k, v in res.items():
                out[k].copy_(v)
            return out
        return res

    def __getitems__(self, indices: Sequence[int]) -> GatheredBatch:
        """Days ``indices`` for ``torch.utils.data.DataLoader``: one padded gather, collated as the batch dict."""
        return GatheredBatch(self.gather_batch(np.asarray(indices, dtype=np.int64)))

    # -- what the loader uses (loader.BatchSource) ---------------------------------------------
    batch_layout = None   # each batch is padded to its own largest day: one batch per gather

    def resident_nbytes(self) -> int:
        return 0

    def resident(self, device: torch.device | str, pin: bool = False) -> Any:
        raise InputError("CrossSectionDataset is fed from the memmap; placement='device'/'pinned' are for "
                         "KlineDataset")

    def loader(self, batch_size: int = 1, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
               num_workers: int | None = None, **options: Any) -> KlineLoader:
        """Loader over days (padding plus mask); same options as :meth:`KlineDataset.loader`."""
        return KlineLoader(self, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                           num_workers=num_workers, **options)
