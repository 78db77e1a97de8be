"""KlineDataset: windows of bars with a forward label, read zero-copy from a store; its loaders.

    store (memmap) -> spec.resolve (SamplePlan) -> windows.valid_index (8 bytes per window)
                   -> gather.Gatherer (one index_select per batch) -> loader.KlineLoader (chunks, threads, device)

A sample is the window of ``window`` days ending at day ``t`` of one symbol over the chosen fields, plus a label:

* ``x``: float32 ``[window, n_fields]``; ``y``: float32 scalar; ``symbol``: index into ``store.symbols``;
  ``t``: calendar index of the window's last day; with ``missing="ffill"`` also ``observed``: bool ``[window]``.
* label ``"return"`` (default): ``close[t + horizon] / close[t] - 1``; ``"log_return"``: its log; any store
  field name: that field's value at day ``t + horizon``. With ``adjust != "none"`` returns use adjusted closes
  (``close * adj_factor``), so a split between ``t`` and the label day is not a -86% return.
* validity (``windows.py``): by default every cell of ``x`` is finite, the label day is inside the calendar and
  its close finite, ``close[t] != 0``; ``missing="ffill"`` and ``days="symbol"`` relax the first rule.
* ``start``/``end``: ``t``'s date is at or after ``start`` and the label's date at or before ``end``: no label
  from outside the range, ever. ``make_splits`` (``splits.py``) builds train/valid/test with an embargo.

The panel is never copied into process memory: the gather reads a private (copy-on-write) mapping of the store's
file, whose pages the kernel reads ahead in the background (shared page cache: N ranks hold one copy). Datasets
pickle as (path, version, spec, stats) and reopen the store lazily in each process (fork and spawn workers).
``resident`` (placement "pinned"/"device") is the one deliberate copy: the fields and days samples read, once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from . import coverage, windows
from .blocks import BlockIndex, BlockSource, attach_store, build_blocks, choose_index
from ..feed.collate import GatheredBatch
from .ranges import DateLike
from ..errors import InputError, KlineStoreError, StoreError
from .gather import Batch, Gatherer, resident_gather, sample_layout
from .block_pages import read_rows, release_rows
from ..feed.loader import KlineLoader
from ..feed.options import LoaderOptions
from ..feed.shm import WorkerRing
from ..feed.source import BatchLayout
from ..features.plan import field_roles
from .spec import Adjust, FieldRoles, Normalize, SamplePlan, SampleSpec, resolve
from ..store import Store, open_store
from ..store.universes import Universe
from ..memory import mem_available
from ..system.pages import readahead
from ..system.ranks import agreed_version

# Windows used to estimate z-score statistics (spread evenly over the index) and per gather call while doing so.
ZSCORE_SAMPLE = 65536
_STAT_CHUNK = 4096
_RING_SLOTS = 8   # per DataLoader worker: its prefetched batches plus those the trainer holds


def position(i: int, n: int, what: str) -> int:
    """Python-style index (negatives count from the end) checked against ``n`` items."""
    i = int(i)
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise IndexError(f"{what} {i} out of range [0, {n})")
    return j


class KlineDataset(BlockSource, torch.utils.data.Dataset):
    """Windows of daily bars with a forward label, read zero-copy from a kline-store.

    Args:
        path: store directory (or an open :class:`~kline_store.store.Store`, whose snapshot is used).
        window: days per window.
        fields: input fields, in this order (default: those of open, high, low, close, volume, amount that the
            store has; never ``adj_factor`` unless asked for). One name may be given as a string.
        horizon: label offset in days (the symbol's own bars with ``days="symbol"``).
        start: first date of ``t`` (None: no bound).
        end: last date of any label day (None: no bound).
        label: "return", "log_return", or a store field name (its value at ``t + horizon``).
        adjust: "none" (raw prices), "forward" (``price[u] * adj_factor[u] / adj_factor[t]``: relative to the
            window's last day, so no later corporate action leaks in; the last day equals raw) or "backward"
            (``price[u] * adj_factor[u]``); volume is divided by the same ratio. Needs an ``adj_factor`` field.
        normalize: "none" (raw values), "window" (prices / the window's last close, volume and amount / their
            window mean) or "zscore" (per field, statistics from ``stats``, else estimated from this dataset's
            own windows: build it on the train split and pass ``ds.stats`` to the others; ``make_splits`` does).
        stats: z-score statistics ``{"fields", "mean", "std"}`` (from another dataset's ``stats``).
        missing: "drop" (a window with a missing day is not a sample) or "ffill" (day ``t`` must have a bar; other
            missing days are forward-filled inside the window, leading ones take the window's first bar, and
            ``observed`` marks real bars).
        max_missing: with ``missing="ffill"``, the most missing days a window may have (None: any).
        days: "calendar" (windows of consecutive calendar days) or "symbol" (the symbol's own last ``window``
            bars; suspended days are skipped; label ``horizon`` bars later).
        version: store version to read (default: the current one, or the open Store's).
        symbols: only these symbols' windows (names; default all). ``sample["symbol"]`` stays the index into
            ``store.symbols``.
        universe: only the samples ``(symbol, t)`` whose day ``t`` is a member day of the symbol in this universe
            of the store (``kline-store universe``, or a Qlib market kept by ingest): exactly the dataset's samples
            without it on those days; a window may reach back before the symbol joined, as Qlib computes over the
            whole series and keeps the rows inside the spans.
        index: "full" (4 bytes per window: the uniform order's index), "blocks" (4 bytes per segment of about
            64 KiB of a row, validity computed when a block is read: for stores bigger than memory, ``days=
            "calendar"`` only) or "auto" (full when building it takes at most half the available memory).

    Raises:
        InputError: unknown field, window longer than the calendar, no valid window in range, adjust without
            ``adj_factor``, bad option.
    """

    def __init__(self, path: str | os.PathLike | Store, window: int = 64, fields: Sequence[str] | str | None = None,
                 horizon: int | None = None, start: DateLike = None, end: DateLike = None, *,
                 label: str | None = None,
                 adjust: Adjust = "none", normalize: Normalize = "none", stats: dict[str, Any] | None = None,
                 missing: Literal["drop", "ffill"] = "drop", max_missing: int | None = None,
                 days: Literal["calendar", "symbol"] = "calendar", version: int | None = None,
                 symbols: Sequence[str] | str | None = None, universe: str | None = None,
                 index: Literal["auto", "full", "blocks"] = "auto") -> None:
        super().__init__()
        store = path if isinstance(path, Store) else None
        self.path = Path(store.path if store is not None else path)
        self.spec = SampleSpec.make(window, fields, horizon, start, end, label=label, adjust=adjust,
                                    normalize=normalize, missing=missing, max_missing=max_missing, days=days,
                                    symbols=symbols, universe=universe)
        if store is not None:
            version = store.version if version is None else version
        self._store: Store | None = store if store is not None and version == store.version else None
        if self._store is None:
            self._store = open_store(self.path, version=version)
        self.version: int = self._store.version
        self.index_mode: str = index
        self.spec = coverage.with_default_fields(self.spec, self.store, self._rows())   # bar stores: every symbol's
        self._reset()
        self._build_index()
        coverage.note_unwindowed(self.store, self.plan, self._index(), self._rows())
        self.stats: dict[str, Any] | None = self._check_stats(stats) if stats is not None else None
        self._agreed = False
        self._agree()
        if self.spec.normalize == "zscore" and self.stats is None:
            self.stats = self.estimate_stats()
            self._cpu = None  # rebuilt with the statistics

    def _agree(self) -> None:
        """Under torch.distributed, read the store version the first rank to open the store read (a
        compare-and-set in the process group's key-value store: no collective, so a rank alone never waits).
        Ranks that open on either side of an ``append`` train on one version; one that cannot open it fails in
        one line. Done at construction, or at the first ``loader()`` when the group starts after that."""
        if self._agreed:
            return
        version = agreed_version(self.store, self.version)
        if version is not None:
            self._agreed = True
            self.use_version(version)

    def _rows(self) -> np.ndarray:
        """Store rows of this dataset's symbols (all when no ``symbols=``)."""
        return self._symbol_rows() if self.spec.symbols is not None else np.arange(self.store.n_symbols)

    def _reset(self) -> None:
        """Derive the plan from the spec (cheap; repeated in each process after unpickling)."""
        st = self.store
        self.plan: SamplePlan = resolve(self.spec, st.fields, st.dates, str(st.path),
                                        FieldRoles(*field_roles(st.manifest)))
        self.member: Universe | None = st.membership(self.spec.universe) if self.spec.universe is not None else None
        self._cpu: Gatherer | None = None
        self._pid = os.getpid()
        self._ring: WorkerRing | None = None
        self._ring_made = False

    def _build_index(self, fresh: bool = False) -> None:
        st = self.store
        mode = choose_index(self.index_mode, st.n_symbols, st.n_dates, self.plan, str(st.path))
        if mode == "blocks":
            idx = build_blocks(st, self.plan, self.member, fresh)
            if self.spec.symbols is not None:   # the symbols left out have no window
                idx.keep_rows(self._symbol_rows())
            self._valid, self._bars = idx, None   # type: ignore[assignment]
            if len(self._valid) == 0:
                raise InputError(self._explain_empty())
            return
        read_rows(st, mem_available() // 2)   # the stored days, not the rows' reserved room
        self._valid, self._bars = self._full_valid()
        if len(self._valid) == 0:
            raise InputError(self._explain_empty())
        release_rows(st)   # gathers read the private mapping: the store's own would hold the panel a second time

    def _full_valid(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The full valid-window index (and bar table) of ``symbols=`` and ``universe=``."""
        valid, bars = windows.valid_index(self.store.panel, self.plan)
        if self.spec.symbols is not None:
            valid = valid[np.isin(valid // self.store.n_dates, self._symbol_rows())]
        if self.member is not None:         # on member days only: the same samples, fewer of them
            valid = valid[self.member.contains(valid)]
        return valid, bars

    def _symbol_rows(self) -> np.ndarray:
        """Store rows of ``symbols=``; one line naming the first unknown one."""
        st = self.store
        index = {s: i for i, s in enumerate(st.symbols)}
        unknown = [s for s in self.spec.symbols or () if s not in index]
        if unknown:
            raise InputError(f"{st.path}: no symbol {unknown[0]!r}" + (f" (and {len(unknown) - 1} more)"
                             if len(unknown) > 1 else "") + f" among its {st.n_symbols:,} symbols ("
                             + ", ".join(st.symbols[:5]) + (", ...)" if st.n_symbols > 5 else ")"))
        return np.asarray([index[s] for s in self.spec.symbols or ()], dtype=np.int64)

    def _explain_empty(self) -> str:
        st, p = self.store, self.plan
        lo, hi = p.lo, p.hi
        span = f"{st.dates[lo]}..{st.dates[hi]}" if 0 <= lo <= hi < st.n_dates else "an empty date range"
        msg = (f"{st.path}: no valid window in {span} (window={p.window}, horizon={p.horizon}, "
               f"fields={self.fields}, missing={p.missing!r}, days={p.days!r})")
        m = self.member
        if m is not None and 0 <= lo <= hi < st.n_dates and not ((m.start <= hi) & (m.end >= lo)).any():
            return msg + f": universe {self.member.name!r} has no member on any day of the range"
        if hi - lo < p.horizon:  # t and its label day must both fit in the range
            return (msg + f": the range holds {max(0, hi - lo + 1)} trading days, a sample needs {p.horizon + 1}"
                    f" (t and its label day); widen start/end or shorten the horizon")
        panel = st.panel[:, max(0, lo - p.window + 1): hi + 1]
        share = {f: float(np.isfinite(panel[:, :, st.fields.index(f)]).mean()) for f in self.fields}
        worst = min(share, key=share.get)  # type: ignore[arg-type]
        return (msg + f": field {worst!r} is finite in only {share[worst]:.1%} of the cells; drop it from "
                f"fields=, use missing='ffill' or days='symbol', or a shorter window")

    @property
    def store(self) -> Store:
        """The open store snapshot (reopened lazily in a new process)."""
        if self._store is None:
            self._store = open_store(self.path, version=self.version, verify=False)
        return self._store

    # -- pickling: (path, version, spec, stats); index and mappings are rebuilt in the new process -------------
    def __getstate__(self) -> dict[str, Any]:
        state = {"path": str(self.path), "version": self.version, "spec": self.spec, "stats": self.stats}
        if isinstance(getattr(self, "_valid", None), BlockIndex):   # workers do not count the segments again
            state["blocks"] = self._valid.state()
        state["index"] = getattr(self, "index_mode", "auto")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = Path(state["path"])
        self.version = state["version"]
        self.spec = state["spec"]
        self.stats = state["stats"]
        self._store = None
        self._agreed = True   # a pickled dataset reads the version it was handed
        self._reset()
        self._valid = None  # type: ignore[assignment]
        self._bars = None
        self.index_mode = state.get("index", "auto")
        if "blocks" in state:
            self._valid = BlockIndex.from_state(state["blocks"])   # type: ignore[assignment]
            attach_store(self._valid, self.store, self.plan, self.member)

    def use_version(self, version: int) -> None:
        """Read store version ``version`` from now on (the index is rebuilt); StoreError when it is gone."""
        if version == self.version:
            return
        mine = self.version
        try:
            store = open_store(self.path, version=version, verify=False)
        except KlineStoreError as exc:
            raise StoreError(f"{self.path}: the other ranks read store version {version}, this rank opened "
                             f"version {mine}, and version {version} cannot be opened here ({exc}); open the "
                             f"dataset with version= on every rank") from None
        self.__setstate__({**self.__getstate__(), "version": version})
        self._store = store
        self._reset()
        self._build_index()

    def _index(self) -> np.ndarray:
        if self._valid is None:
            self._build_index()
        return self._valid

    # -- what it is -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index())

    @property
    def window(self) -> int:
        return self.spec.window

    @property
    def horizon(self) -> int:
        """Bars from a window's last day to its label's day (a features store's label: its reach)."""
        return self.plan.horizon

    @property
    def fields(self) -> list[str]:
        return list(self.plan.names)

    @property
    def symbols(self) -> list[str]:
        return self.store.symbols

    @property
    def dates(self) -> np.ndarray:
        return self.store.dates

    def full_index(self) -> np.ndarray:
        """The valid-window index, built now when this dataset keeps the O(blocks) one (``index="blocks"``); a
        one-line InputError when it does not fit in the available memory."""
        if isinstance(self._index(), BlockIndex):
            st = self.store
            choose_index("full", st.n_symbols, st.n_dates, self.plan, str(st.path))
            cpu = self._cpu
            self._valid, self._bars = self._full_valid()
            self.index_mode = "full"
            self._cpu = cpu
        return self._valid

    def valid_index(self) -> np.ndarray:
        """Flat cell index ``symbol * n_dates + t`` of every sample, sorted (int32 where it fits, read-only)."""
        v = self.full_index().view()
        v.flags.writeable = False
        return v

    def locate(self, indices: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Sample positions -> ``(symbol, t)`` int64 arrays."""
        return windows.decode(self._index()[np.asarray(indices, dtype=np.int64)], self.store.n_dates)

    def label_days(self, indices: np.ndarray | Sequence[int]) -> np.ndarray:
        """Calendar index of each sample's label day."""
        flat = self._index()[np.asarray(indices, dtype=np.int64)]
        if self._bars is not None:
            return windows.symbol_label_day(flat, self._bars, self.horizon) % self.store.n_dates
        return flat % self.store.n_dates + self.horizon

    def day_span(self) -> tuple[int, int]:
        """``(d0, d1)``: calendar days ``[d0, d1)`` any sample reads (window days and label days)."""
        v = self._index()
        if isinstance(v, BlockIndex):
            return v.day_span(self.window, self.horizon)
        nd = self.store.n_dates
        if self._bars is not None:
            j = np.searchsorted(self._bars, v)
            first = int((self._bars[j - (self.window - 1)] % nd).min())
        else:
            first = int((v % nd).min()) - (self.window - 1)
        last = int(self.label_days(np.arange(len(v))).max())
        return first, last + 1

    # -- gather -------------------------------------------------------------------------
    def _cpu_gatherer(self) -> Gatherer:
        if self._cpu is None or self._pid != os.getpid():
            st = self.store
            flat = st.map_private()   # row s of the file is symbol s (DESIGN.md)
            if isinstance(self._index(), BlockIndex):   # bigger than memory: blocks are read as they come
                self._index().add_mapping(flat)
            else:   # the first epoch at full speed: each row's stored days read ahead and mapped in the background
                readahead(flat, np.arange(st.n_symbols, dtype=np.int64) * (st.row_stride * 4),
                          st.n_dates * st.n_fields * 4)
            bars = torch.from_numpy(self._bars.astype(np.int64)) if self._bars is not None else None
            self._cpu = Gatherer(self.plan, torch.from_numpy(flat), st.row_stride, st.n_fields, 0, bars,
                                 self._stats_t())
            self._pid = os.getpid()
        return self._cpu

    def _stats_t(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.stats is None:
            return None
        mean = torch.tensor(self.stats["mean"], dtype=torch.float32, device=device)
        std = torch.tensor(self.stats["std"], dtype=torch.float32, device=device)
        return mean, std

    def gather_flat(self, flat: np.ndarray, out: Batch | None = None) -> Batch:
        """Batch for flat cell indices (``symbol * n_dates + t``) of valid windows."""
        s, t = windows.decode(flat, self.store.n_dates)
        return self._cpu_gatherer().gather(s, t, out)

    def gather_batch(self, indices: np.ndarray | Sequence[int] | torch.Tensor, out: Batch | None = None) -> Batch:
        """A whole batch in one vectorised gather (the loaders' path).

        Args:
            indices: sample positions ``0 <= i < len(self)``.
            out: optional preallocated tensors to fill (same keys as the result; leading dimension >= B, the
                first B rows are used and returned).

        Returns:
            dict: ``x`` float32 ``[B, window, n_fields]``, ``y`` float32 ``[B]``, ``symbol`` and ``t`` int64
            ``[B]`` (plus ``observed`` bool ``[B, window]`` with ``missing="ffill"``).
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        v = self._index()
        if idx.size and (idx.min() < 0 or idx.max() >= len(v)):
            raise IndexError(f"sample index out of range [0, {len(v)})")
        return self.gather_flat(v[idx], out)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One sample, read straight from the memmap: ``x``, ``y``, ``symbol`` (int), ``t`` (int)."""
        v = self._index()
        s, t = divmod(int(v[position(i, len(v), "sample")]), self.store.n_dates)
        return self._cpu_gatherer().sample(s, t)

    def __getitems__(self, indices: Sequence[int]) -> GatheredBatch:
        """A whole batch for ``torch.utils.data.DataLoader``: one gather, collated as the batch dict.

        In a DataLoader worker the batch is gathered into the worker's shared-memory ring (``shm.py``).
        """
        idx = np.asarray(indices, dtype=np.int64)
        ring = self._worker_ring(len(idx))
        slot = ring.take(len(idx)) if ring is not None else None
        if slot is None:
            return GatheredBatch(self.gather_batch(idx))
        try:
            batch = self.gather_batch(idx, out=ring.tensors(slot, len(idx)))  # type: ignore[union-attr]
        except BaseException:
            ring.flags[slot] = 0  # type: ignore[union-attr]
            raise
        return GatheredBatch(batch, ring.handoff(slot, len(idx)))  # type: ignore[union-attr]

    def _worker_ring(self, n: int) -> WorkerRing | None:
        if not self._ring_made and torch.utils.data.get_worker_info() is not None:
            self._ring_made = True
            self._ring = WorkerRing.create(self.batch_layout, n, _RING_SLOTS)
        return self._ring

    # -- statistics -------------------------------------------------------------------------
    def estimate_stats(self, max_windows: int = ZSCORE_SAMPLE) -> dict[str, Any]:
        """Per-field mean and std over (up to ``max_windows``, evenly spread) windows of this dataset.

        Values are taken as the model sees them before z-scoring (adjusted, filled); only observed cells count.
        """
        n = len(self)
        pos = np.unique(np.linspace(0, n - 1, min(n, max_windows)).astype(np.int64))
        k = len(self.fields)
        total, total_sq, count = np.zeros(k), np.zeros(k), np.zeros(k)
        g = self._cpu_gatherer()
        for a in range(0, len(pos), _STAT_CHUNK):
            s, t = self.locate(pos[a: a + _STAT_CHUNK])
            b = g.gather(s, t, normalize=False)
            x = b["x"].double()
            m = torch.isfinite(x)
            if "observed" in b:  # forward-filled cells are not data
                m &= b["observed"][:, :, None]
            x = torch.where(m, x, torch.zeros_like(x))
            total += x.sum(dim=(0, 1)).numpy()
            total_sq += (x * x).sum(dim=(0, 1)).numpy()
            count += m.sum(dim=(0, 1)).numpy()
        mean = total / np.maximum(count, 1)
        std = np.sqrt(np.maximum(total_sq / np.maximum(count, 1) - mean * mean, 0.0))
        std[~(std > 0)] = 1.0  # a constant field: centre it, do not blow it up
        return {"fields": list(self.fields), "mean": mean.tolist(), "std": std.tolist(), "windows": len(pos)}

    def _check_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        if list(stats.get("fields", [])) != self.fields or len(stats.get("mean", [])) != len(self.fields) \
                or len(stats.get("std", [])) != len(self.fields):
            raise InputError(f"stats are for fields {stats.get('fields')}, this dataset has {self.fields}; "
                             f"pass the train dataset's .stats built with the same fields")
        return dict(stats)

    # -- what the loader uses (loader.BatchSource) ---------------------------------------------
    @property
    def batch_layout(self) -> BatchLayout:
        """Shape and dtype of one sample per key (all samples have one shape)."""
        return sample_layout(self.plan)

    def resident_nbytes(self) -> int:
        """Bytes of a resident copy: the fields samples use, the days they read."""
        d0, d1 = self.day_span()
        keep, _ = self.plan.compact()
        return self.store.n_symbols * (d1 - d0) * len(keep) * 4

    def resident(self, device: torch.device | str, pin: bool = False) -> Callable[..., Batch]:
        """Copy the used part of the panel to ``device`` once; returns ``gather(positions) -> batch`` running there.

        ``positions`` are sample positions (int64 tensor, any device); the batch's tensors live on ``device``.
        With ``device="cpu"`` and ``pin=True`` the copy is in pinned host memory.
        """
        dev = torch.device(device)
        return resident_gather(self.store.panel, self.plan, self.day_span(), self.full_index(), self._bars,
                               self._stats_t(dev), dev, pin)

    # -- loaders ---------------------------------------------------------------------------
    def loader(self, batch_size: int = 256, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
               num_workers: int | None = None, **options: Any) -> KlineLoader:
        """Batch loader: chunked vectorised gathers in threads, deterministic, resumable, sharded over DDP ranks,
        delivered on ``device``. See :class:`kline_store.feed.loader.KlineLoader` for every option.

        Under torch.distributed every rank reads one store version (see :meth:`_agree`)."""
        return self.loader_with(LoaderOptions.of(batch_size=batch_size, shuffle=shuffle, seed=seed,
                                                 drop_last=drop_last, num_workers=num_workers, **options))

    def loader_with(self, options: LoaderOptions) -> KlineLoader:
        """The loader of ``options``, every option in one object (:class:`~kline_store.feed.options.LoaderOptions`)."""
        self._agree()
        return KlineLoader(self, options=options)

    def __repr__(self) -> str:
        p = self.plan
        label = p.label_kind if p.label_field is None else self.store.fields[p.label_field]
        return (f"KlineDataset({str(self.path)!r}, v{self.version}, {len(self)} windows, window={p.window}, "
                f"horizon={p.horizon}, fields={_short_list(self.fields)}, label={label!r})")


def _short_list(names: list[str], keep: int = 8) -> str:
    """A field list for a repr: 158 feature names are a page, not a line."""
    return str(names) if len(names) <= keep else f"[{', '.join(map(repr, names[:keep]))}, ... ({len(names)} fields)]"
