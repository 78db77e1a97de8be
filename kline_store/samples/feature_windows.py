"""Features computed on the fly from raw windows, where they are gathered (the CPU or the GPU): no features store.

For users whose features store would not fit on disk or in memory. Each sample reads ``window + L`` raw bars
(L: the longest history the expressions read) and evaluates the expressions on the batch as one
``[batch, window + L]`` panel, one row per sample, keeping the last ``window`` bars. A sample is a window of
``window + L`` bars with every input finite (the base dataset's rule), so its series begins at or before the
window and its values equal those of a features store computed by ``compute_features`` on the same bars.
Expressions that look ahead or read the whole series (an expanding or exponential window) are refused: a
window holds neither.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..features import cross_section
from ..features.evaluate import evaluate
from ..features.plan import FIELD_ALIASES, make_plan
from ..feed.loader import KlineLoader
from ..feed.options import LoaderOptions
from ..store.snapshot import Store, open_store
from .dataset import KlineDataset, position

Batch = dict[str, torch.Tensor]


class FeatureWindows(torch.utils.data.Dataset):
    """``KlineDataset`` whose ``x`` is ``window`` bars of expressions evaluated from raw bars as batches are made.

    Args:
        path: a bar store (or an open Store).
        window: bars of features per sample.
        exprs: ``{name: Qlib expression}``, or ``["NAME=EXPR", ...]``, or a set name ("alpha158").
        horizon, start, end, label and the other options: as :class:`KlineDataset` (label: the base store's).

    ``x`` is ``[B, window, len(exprs)]`` float32; ``y``, ``symbol`` and ``t`` as KlineDataset's.
    """

    def __init__(self, path: str | os.PathLike | Store, window: int, exprs: Mapping[str, str] | Sequence[str] | str,
                 horizon: int | None = None, start=None, end=None, **options: Any) -> None:
        super().__init__()
        if isinstance(exprs, str):
            self.plan = make_plan([exprs], None, label=None)
        elif isinstance(exprs, Mapping):
            self.plan = make_plan([], dict(exprs), label=None)
        else:
            self.plan = make_plan([], list(exprs), label=None)
        if self.plan.max_lookahead:
            ahead = [f.name for f in self.plan.fields if f.lookahead]
            raise InputError(f"features {', '.join(ahead)} read bars after their day: on-the-fly features of a "
                             "window cannot look ahead (use them as a label of a features store)")
        if self.plan.max_lookback is None:
            whole = [f.name for f in self.plan.fields if f.lookback is None]
            raise InputError(f"features {', '.join(whole)} read the whole series (an expanding or exponential "
                             "window): compute them into a features store with compute_features")
        crossing = [f.name for f in self.plan.fields if cross_section.crossing(f.node)]
        if crossing:
            raise InputError(f"features {', '.join(crossing)} are cross-sectional (CSRank, ...): they need every "
                             "symbol of a day, a batch holds some; compute them into a features store with "
                             "compute_features")
        self.extra = int(self.plan.max_lookback)
        self._window = int(window)
        probe = path if isinstance(path, Store) else None
        fields = self._inputs(probe.fields if probe is not None else _fields_of(path))
        self.base = KlineDataset(path, self._window + self.extra, fields, horizon, start, end, **options)
        self.inputs = {name: self.base.fields.index(stored) for name, stored in self._names.items()}

    def _inputs(self, store_fields: Sequence[str]) -> list[str]:
        self._names: dict[str, str] = {}
        for name in sorted(self.plan.inputs()):
            stored = name if name in store_fields else FIELD_ALIASES.get(name)
            if stored not in store_fields:
                raise InputError(f"feature input ${name}: the store has no such field ({', '.join(store_fields)})")
            self._names[name] = stored
        return sorted(set(self._names.values()), key=list(store_fields).index)

    # -- the BatchSource protocol (feed/source.py) -------------------------------------------
    block_order_ok = False    # the uniform order only: features are computed per window, not per block
    keeps_full_index = True

    @property
    def path(self) -> Path:
        return self.base.path

    @property
    def version(self) -> int:
        """The store version read (a loader's state records it and is refused on another)."""
        return self.base.version

    def __len__(self) -> int:
        return len(self.base)

    def sample_digest(self) -> str:
        return self.base.sample_digest()

    def recount(self) -> None:
        self.base.recount()

    @property
    def window(self) -> int:
        return self._window

    @property
    def horizon(self) -> int:
        return self.base.horizon

    @property
    def fields(self) -> list[str]:
        return self.plan.names

    @property
    def batch_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        layout = dict(self.base.batch_layout)
        layout["x"] = ((self._window, len(self.plan.fields)), torch.float32)
        layout.pop("observed", None)
        return layout

    def _features(self, raw: Batch, out: Batch | None) -> Batch:
        x = raw["x"]                                       # [B, window + L, inputs]
        n, length = x.shape[0], x.shape[1]
        values = {name: x[:, :, k] for name, k in self.inputs.items()}
        first = torch.zeros(n, dtype=torch.int64)          # every bar of the window is finite: its series began
        last = torch.full((n,), length - 1, dtype=torch.int64)
        feats = evaluate({f.name: f.node for f in self.plan.fields}, values, first, last).values[:, self.extra:].contiguous()
        batch = {k: v for k, v in raw.items() if k not in ("x", "observed")}
        batch["x"] = feats
        if out is None:
            return batch
        for k, v in batch.items():
            out[k][: len(v)].copy_(v)
        return {k: out[k][:n] for k in batch}

    def gather_batch(self, indices: np.ndarray | Sequence[int] | torch.Tensor, out: Batch | None = None) -> Batch:
        return self._features(self.base.gather_batch(indices), out)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One sample as KlineDataset's: ``x`` ``[window, features]``, ``y`` a 0-d float32 tensor, ``symbol`` and
        ``t`` ints."""
        b = self.gather_batch(np.array([position(i, len(self), "sample")]))
        return {k: (v[0] if k in ("x", "y") else int(v[0])) for k, v in b.items()}

    def resident_nbytes(self) -> int:
        return self.base.resident_nbytes()

    def resident(self, device: torch.device | str, pin: bool = False) -> Callable[..., Batch]:
        """The raw bars resident on ``device``; features evaluated there, batch by batch."""
        gather = self.base.resident(device, pin)

        def run(indices: torch.Tensor | np.ndarray, out: Batch | None = None) -> Batch:
            return self._features(gather(indices), out)

        return run

    def loader(self, batch_size: int = 256, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
               num_workers: int | None = None, **options: Any) -> KlineLoader:
        """As :meth:`KlineDataset.loader`: features are computed in the gather threads (or on the device). Under
        torch.distributed every rank reads one store version (see :meth:`KlineDataset._agree`)."""
        return self.loader_with(LoaderOptions.of(batch_size=batch_size, shuffle=shuffle, seed=seed,
                                                 drop_last=drop_last, num_workers=num_workers, **options))

    def loader_with(self, options: LoaderOptions) -> KlineLoader:
        """The loader of ``options``, every option in one object (:class:`~kline_store.feed.options.LoaderOptions`)."""
        self.base._agree()
        return KlineLoader(self, options=options)

    def __repr__(self) -> str:
        return (f"FeatureWindows({str(self.base.path)!r}, {len(self)} windows, window={self._window} (+{self.extra} "
                f"bars read back), {len(self.plan.fields)} features, horizon={self.horizon})")


def _fields_of(path: str | os.PathLike) -> list[str]:
    with open_store(path, verify=False) as st:
        return list(st.fields)


__all__ = ["FeatureWindows"]
