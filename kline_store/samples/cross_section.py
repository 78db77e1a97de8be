"""CrossSectionDataset: one item per day with every symbol's valid window, for ranking and IC losses.

Items are grouped from a KlineDataset's valid-window index (``windows.by_day``: 8 bytes a window), or, for stores
bigger than memory, counted per segment of days (``day_blocks.py``: 4 bytes a segment, a segment's days and windows
computed when its block is read); a batch of days is padded to its largest day with a ``mask``, gathered in one
call over all its windows.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import windows
from .day_blocks import DayBlocks, DayBlockSource, build_day_blocks, choose_day_index
from ..feed.collate import GatheredBatch
from .dataset import KlineDataset, position
from .ranges import DateLike
from ..errors import InputError
from ..feed.loader import KlineLoader
from ..feed.options import LoaderOptions
from ..store import Store


class CrossSectionDataset(DayBlockSource, torch.utils.data.Dataset):
    """One item per calendar day with at least ``min_count`` valid windows: all of that day's windows.

    Item: ``x`` ``[n, window, n_fields]``, ``y`` ``[n]``, ``symbol`` ``[n]`` int64, ``t`` int. Batches from
    :meth:`loader` stack days with padding: ``x`` ``[B, n_max, window, n_fields]``, ``y`` ``[B, n_max]`` (0 in
    padding), ``symbol`` ``[B, n_max]`` (-1 in padding), ``mask`` bool ``[B, n_max]``, ``t`` ``[B]``.

    Args: as :class:`KlineDataset` (``path``, ``window``, ``fields``, ``horizon``, ``start``, ``end`` and the
    keyword options; ``universe=NAME``: a day holds that day's members), plus ``min_count``: fewest windows a day needs to be an item. ``path`` may also be a
    KlineDataset, whose windows are grouped (its own parameters apply; pass no others). ``index``: "full" (the
    by-day table, 8 bytes a window), "blocks" (item days counted per segment of dates, 4 bytes a segment: for stores
    bigger than memory, ``days="calendar"`` only; ``loader(order="blocks")`` reads a block of dates across the
    symbols at a time) or "auto" (full when the dataset keeps its full index and the table takes at most half the
    available memory); a KlineDataset given as ``path`` decides by its own ``index``.
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
        if len(self) == 0:
            raise InputError(f"{self.windows.path}: no day has {self.min_count} or more valid windows")

    def _build(self) -> None:
        """The day blocks or the by-day table, as the dataset's index and the available memory allow."""
        w, st = self.windows, self.windows.store
        self._days = self._offsets = self._order = None    # type: ignore[assignment]
        self._xs: DayBlocks | None = None
        self._xs_view: DayBlocks | None = None
        mode = "blocks" if not w.keeps_full_index else getattr(w, "index_mode", "auto")
        if choose_day_index(mode, st.n_symbols, st.n_dates, w.plan, str(st.path)) == "blocks":
            self._xs = build_day_blocks(st, w.plan, self._rows(), self.min_count, w.member)
        else:
            self._make_table()

    def sample_digest(self) -> str:
        """The number of item days and a checksum of the day counts (see ``KlineDataset.sample_digest``)."""
        counts = zlib.crc32(self._xs.counts.tobytes()) if self._xs is not None else 0
        return f"{len(self):,} days (counts {counts:08x}); windows: {self.windows.sample_digest()}"

    def recount(self) -> None:
        """Count again from the store, not trusting the cache (the ranks disagreed)."""
        self.windows.recount()
        if self._xs is not None:
            w = self.windows
            self._xs = build_day_blocks(w.store, w.plan, self._rows(), self.min_count, w.member, fresh=True)

    def _rows(self) -> np.ndarray | None:
        """Symbol rows with windows, ascending (None: every row)."""
        return None if self.windows.spec.symbols is None else np.unique(self.windows._symbol_rows())

    def _make_table(self) -> None:
        st = self.windows.store
        days, offsets, order = windows.by_day(self.windows.valid_index(), st.n_symbols, st.n_dates)
        keep = np.diff(offsets) >= self.min_count
        if not keep.all():
            counts = np.diff(offsets)[keep]
            order = np.concatenate([order[a:b] for a, b in zip(offsets[:-1][keep], offsets[1:][keep])]) \
                if keep.any() else order[:0]
            offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
            days = days[keep]
        self._days, self._offsets, self._order = days, offsets, order

    def __getstate__(self) -> dict[str, Any]:
        state = {"windows": self.windows, "min_count": self.min_count}
        if self._xs is not None:     # workers do not count again
            state["xs"] = self._xs.state()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.windows = state["windows"]
        self.min_count = state["min_count"]
        self._days = None  # type: ignore[assignment]
        self._xs = self._xs_view = None
        if "xs" in state:
            self._xs = DayBlocks.from_state(state["xs"])
            self._xs.attach(self.windows.store, self.windows.plan, self.windows.member)

    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._days is None:
            self._make_table()
        return self._days, self._offsets, self._order

    def full_index(self) -> np.ndarray:
        """The by-day table (its windows, day after day), built now when this dataset keeps day blocks; a one-line
        InputError when it does not fit in the available memory."""
        if self._xs is not None:
            st = self.windows.store
            choose_day_index("full", st.n_symbols, st.n_dates, self.windows.plan, str(st.path))
            self.windows.full_index()
            self._make_table()
            self._xs = None
        return self._tables()[2]

    def __len__(self) -> int:
        return len(self._xs) if self._xs is not None else len(self._tables()[0])

    @property
    def path(self) -> Path:
        return self.windows.path

    @property
    def store(self) -> Store:
        return self.windows.store

    @property
    def version(self) -> int:
        """The store version read (a loader's state records it and is refused on another)."""
        return self.windows.version

    @property
    def window(self) -> int:
        return self.windows.window

    @property
    def fields(self) -> list[str]:
        return self.windows.fields

    @property
    def days(self) -> np.ndarray:
        """Calendar index of each item's day (with day blocks: computed now, a group of segments at a time)."""
        return self._xs.all_days() if self._xs is not None else self._tables()[0]

    @property
    def stats(self) -> dict[str, Any] | None:
        return self.windows.stats

    def day_windows(self, i: int) -> np.ndarray:
        """Flat cell indices of day item ``i``'s windows (sorted by symbol)."""
        return self._day_windows(np.array([position(i, len(self), "day")]))[2]

    def _day_windows(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(t, n, flat)`` of day items ``idx``: days, numbers of windows, their flat cells one day after another."""
        if self._xs is not None:
            return self._xs.windows(idx)
        days, off, order = self._tables()
        if idx.size and (idx.min() < 0 or idx.max() >= len(days)):
            raise IndexError(f"day index out of range [0, {len(days)})")
        n = off[idx + 1] - off[idx]
        within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        return days[idx], n, order[np.repeat(off[idx], n) + within]

    def __getitem__(self, i: int) -> dict[str, Any]:
        t, _, flat = self._day_windows(np.array([position(i, len(self), "day")]))
        b = self.windows.gather_flat(flat)
        b["t"] = int(t[0])  # type: ignore[assignment]
        return b

    def gather_batch(self, indices: np.ndarray | Sequence[int] | torch.Tensor,
                     out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Days ``indices`` padded to the largest: one gather for all their windows (padding slots re-read the
        first window, then are cleared)."""
        idx = indices.numpy() if isinstance(indices, torch.Tensor) else np.asarray(indices)
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        t, counts, cells = self._day_windows(idx)
        b = len(idx)
        n_max = int(counts.max()) if b else 0
        slot = np.arange(n_max)[None, :]
        mask = slot < counts[:, None]
        first = (np.cumsum(counts) - counts)[:, None]
        src = np.where(mask, first + slot, first)  # padding -> the day's first window
        flat = cells[src.reshape(-1)]
        g = self.windows.gather_flat(flat)
        pad = torch.from_numpy(np.flatnonzero(~mask.reshape(-1)))
        res: dict[str, torch.Tensor] = {}
        for k, v in g.items():
            if k == "t":
                continue
            if len(pad):
                v.index_fill_(0, pad, -1 if k == "symbol" else 0)
            res[k] = v.view(b, n_max, *v.shape[1:])
        res["t"] = torch.from_numpy(np.ascontiguousarray(t, dtype=np.int64))
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
        """Loader over days (padding plus mask); same options as :meth:`KlineDataset.loader`. ``order="blocks"``
        (or "auto" when the bytes samples read exceed half the available memory): blocks of consecutive dates
        across the symbols, a pool of ``pool_blocks`` (default max(64, 8 x batch_size)) live at a time.

        Under torch.distributed every rank reads one store version (see :meth:`KlineDataset._agree`)."""
        return self.loader_with(LoaderOptions.of(batch_size=batch_size, shuffle=shuffle, seed=seed,
                                                 drop_last=drop_last, num_workers=num_workers, **options))

    def loader_with(self, options: LoaderOptions) -> KlineLoader:
        """The loader of ``options``, every option in one object (:class:`~kline_store.feed.options.LoaderOptions`)."""
        version = self.windows.version
        self.windows._agree()
        if self.windows.version != version:
            self._build()
        return KlineLoader(self, options=options)
