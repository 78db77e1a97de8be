"""KlineLoader: index batches (sampling.py) -> one vectorised gather per batch -> batch dicts.

The order is made in the consuming process from ``(seed, epoch, rank, world_size)`` only; DataLoader workers
(fork or spawn) only gather the index batches they are handed, so ``num_workers`` never changes the order.
``position`` counts samples *delivered to the caller*, not batches prefetched by workers, which is what makes
``state_dict()`` taken in the middle of an epoch resume exactly at the next batch.

Epochs: iterating yields the remaining batches of the current epoch; when its last batch is handed out the
loader moves to the next epoch (a new permutation), so iterating again without ``set_epoch`` does not repeat
an order. ``set_epoch(e)`` with the current epoch keeps the position (a resumed run can call it unconditionally).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader

from .errors import InputError
from .sampling import EpochBatches

# DataLoader options the loader owns; users pass the rest (num_workers, pin_memory, prefetch_factor,
# persistent_workers, timeout, multiprocessing_context, worker_init_fn, pin_memory_device, in_order, ...).
_OWN = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


def _identity(batch: Any) -> Any:
    return batch


class _BatchFetch(torch.utils.data.Dataset):
    """Map-style view whose item is a whole batch: ``fetch[index_array] -> dataset.gather_batch(index_array)``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: np.ndarray) -> Any:
        return self.dataset.gather_batch(indices)


def dist_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed's when it is initialised, else ``(0, 1)``."""
    if (rank is None or world_size is None) and torch.distributed.is_available() \
            and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank() if rank is None else rank
        world_size = torch.distributed.get_world_size() if world_size is None else world_size
    return (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))


class KlineLoader:
    """Deterministic, resumable, DDP-sharded batch loader over a dataset with ``gather_batch``.

    Args:
        dataset: a KlineDataset or CrossSectionDataset (anything with ``__len__`` and ``gather_batch``).
        batch_size: samples per batch.
        shuffle: a new permutation each epoch (else the index order).
        seed: base seed; the order depends only on (seed, epoch, rank, world_size).
        drop_last: drop this rank's last incomplete batch.
        num_workers: DataLoader worker processes gathering batches (0: in this process).
        rank: this rank (default: torch.distributed's, else 0).
        world_size: number of ranks (default: torch.distributed's, else 1).
        tail: uneven split over ranks: "pad" (repeat the first samples of the epoch's order so every rank gets
            ceil(n / world) samples; all samples covered) or "drop" (leave the last n % world out this epoch).
        **dataloader_kwargs: passed to ``torch.utils.data.DataLoader`` (pin_memory, prefetch_factor,
            persistent_workers, timeout, multiprocessing_context, worker_init_fn, collate_fn applied to each
            batch dict, ...).

    Attributes:
        batch_sampler: the :class:`~kline_store.sampling.EpochBatches` holding order and position.
        dataloader: the underlying ``torch.utils.data.DataLoader`` (its items are whole batches).
    """

    def __init__(self, dataset: Any, batch_size: int = 256, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_workers: int = 0, *, rank: int | None = None,
                 world_size: int | None = None, tail: Literal["pad", "drop"] = "pad",
                 **dataloader_kwargs: Any) -> None:
        bad = [k for k in dataloader_kwargs if k in _OWN]
        if bad:
            raise InputError(f"loader(): {', '.join(bad)} cannot be passed through; the loader makes its own "
                             f"batches (use batch_size=, shuffle=, drop_last= of loader())")
        if dataloader_kwargs.get("in_order") is False:
            raise InputError("loader(in_order=False): batches would arrive in worker timing order; the loader's "
                             "order must depend only on (seed, epoch, rank, world_size)")
        rank, world_size = dist_rank_world(rank, world_size)
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.batch_sampler = EpochBatches(len(dataset), self.batch_size, shuffle, seed, drop_last, rank,
                                          world_size, tail)
        collate = dataloader_kwargs.pop("collate_fn", None) or _identity
        if num_workers == 0:  # meaningless without workers, and DataLoader rejects them: a sweep may pass them
            for k in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
                dataloader_kwargs.pop(k, None)
        else:  # workers reopen the store and rebuild the window index: once, not every epoch
            dataloader_kwargs.setdefault("persistent_workers", True)
        # batch_size=None + a sampler of index arrays: each fetch is one dataset[index_array] -> one gather.
        self.dataloader = DataLoader(_BatchFetch(dataset), batch_size=None, sampler=self.batch_sampler,
                                     collate_fn=collate, num_workers=num_workers, **dataloader_kwargs)

    # -- iteration ----------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        sampler = self.batch_sampler
        epoch = sampler.epoch
        plan = iter(sampler)  # the same batches the DataLoader is about to fetch, for their sizes
        for batch in self.dataloader:
            sampler.advance(len(next(plan)))  # before handing it out: a state_dict taken now includes it
            yield batch
        if sampler.epoch == epoch:  # nothing left in this epoch (empty shard, or a resumed end): next one
            sampler.set_epoch(epoch + 1)

    def index_batches(self) -> Iterator[np.ndarray]:
        """The remaining index batches of the current epoch, in order (does not advance; see :meth:`advance`)."""
        return iter(self.batch_sampler)

    def advance(self, n_samples: int) -> None:
        """Record ``n_samples`` delivered by code that iterates :meth:`index_batches` itself (device feeding)."""
        self.batch_sampler.advance(n_samples)

    def __len__(self) -> int:
        """Batches per full epoch on this rank."""
        return len(self.batch_sampler)

    # -- epochs and state --------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.batch_sampler.epoch

    @property
    def rank(self) -> int:
        return self.batch_sampler.rank

    @property
    def world_size(self) -> int:
        return self.batch_sampler.world_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a no-op for the current epoch (keeps a resumed position)."""
        self.batch_sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "seed", "position", ...}``: plain values, safe to save with a checkpoint."""
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state: the next iteration yields exactly the remaining batches of that epoch."""
        self.batch_sampler.load_state_dict(state)

    def __repr__(self) -> str:
        s = self.batch_sampler
        return (f"KlineLoader({len(self.dataset)} samples, batch_size={self.batch_size}, epoch={s.epoch}, "
                f"position={s.position}, rank={s.rank}/{s.world_size})")


def maybe_wrap(loader: KlineLoader, dataset: Any, device: Any, placement: str, config: Any) -> Any:
    """Hand the loader to ``kline_store.device.wrap_loader`` when GPU feeding is asked for.

    Asked for: a ``device``, a ``config``, or a ``placement`` other than "auto"/"memmap" ("auto" without a
    device is memmap streaming, which is this loader).
    """
    if device is None and config is None and placement in ("auto", "memmap"):
        return loader
    try:
        from .device import wrap_loader
    except ImportError as exc:
        raise NotImplementedError(f"device feeding (device={device!r}, placement={placement!r}) needs "
                                  f"kline_store.device.wrap_loader, which failed to import: {exc}") from exc
    return wrap_loader(loader, dataset, device=device, placement=placement, config=config)
