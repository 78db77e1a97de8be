"""A plain ``torch.utils.data.DataLoader`` over a dataset, one gather per batch.

``DataLoader`` fetches a batch with ``dataset.__getitems__(indices)`` when the dataset has it, then calls the
collate function on the result. Our datasets return a :class:`GatheredBatch`: the whole batch, gathered at once,
that also reads as a sequence of samples. ``default_collate`` looks up the type of the first sample in its
registry, ``default_collate_fn_map`` (the documented way to extend it); the entry added here returns the gathered
batch as it is, so ``DataLoader(ds, batch_size=B)`` yields the same batch dict as ``ds.loader(batch_size=B)``
without stacking B samples. A custom ``collate_fn`` still receives a sequence of per-sample dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data._utils.collate import collate, default_collate_fn_map

from .batches import batch_length


class SampleRow(dict):
    """One sample of a :class:`GatheredBatch` (a dict; its type tells ``default_collate`` where it came from)."""


class GatheredBatch(Sequence):
    """A batch gathered in one call, also readable sample by sample.

    Args:
        batch: the batch dict (tensors of ``B`` rows).
        payload: what ``default_collate`` returns instead of ``batch`` (a worker's shared-memory handoff), or None.
    """

    def __init__(self, batch: dict[str, torch.Tensor], payload: Any = None) -> None:
        self.batch = batch
        self.payload = batch if payload is None else payload

    def __len__(self) -> int:
        return batch_length(self.batch)

    def __getitem__(self, i: int) -> SampleRow:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        shared = self.payload is not self.batch   # rows outlive the ring slot: copy out of it
        row = SampleRow()
        for k, v in self.batch.items():
            if k in ("symbol", "t") and v.dim() == 1:
                row[k] = int(v[i])
            else:
                row[k] = v[i].clone() if shared else v[i]
        return row


def _collate_gathered(batch: Any, *, collate_fn_map: dict | None = None) -> Any:
    if isinstance(batch, GatheredBatch):
        return batch.payload
    # A list of rows put together by hand: collate key by key, as default_collate does for dicts.
    return {k: collate([d[k] for d in batch], collate_fn_map=collate_fn_map) for k in batch[0]}


default_collate_fn_map[SampleRow] = _collate_gathered
