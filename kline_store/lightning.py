"""KlineDataModule: train/val/test loaders from ``make_splits`` for PyTorch Lightning (``pip install
'kline-store[lightning]'``).

Lightning passes loaders that are not ``torch.utils.data.DataLoader`` through untouched, so no
``DistributedSampler`` is injected: under a DDP strategy the process group exists before ``setup`` and each
loader takes its rank's shard from ``torch.distributed`` itself, every rank the same number of steps. Lightning
calls ``loader.sampler.set_epoch(epoch)`` each epoch and saves the training loader's ``state_dict`` in its
checkpoints, so a resumed run continues mid-epoch exactly. On a GPU the batches are delivered on the trainer's
device by kline-store's own pipeline (pinned, side-stream copies, or a resident panel), and Lightning's own
transfer then has nothing left to do.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as lp
import torch

from .samples.ranges import DateLike
from .errors import InputError
from .feed.loader import KlineLoader
from .feed.options import LoaderOptions, split_options
from .samples.splits import Splits, make_splits

Range = tuple[DateLike, DateLike]


class KlineDataModule(lp.LightningDataModule):
    """Leakage-safe date splits of a kline-store as a LightningDataModule.

    Args:
        store: the store directory.
        window: days per window.
        splits: ``{"train": (start, end), "val": (start, end), "test": (start, end)}`` ("val"/"test" optional;
            "valid" is accepted for "val", as in make_splits);
            see :func:`kline_store.make_splits` (an embargo of at least ``horizon`` days separates them).
        batch_size: samples per batch (every split).
        fields: input fields (default: OHLCV and amount).
        horizon: label offset in days.
        seed: shuffling seed of the training loader (validation and test are not shuffled).
        device: "auto" (the trainer's device: batches arrive there from kline-store's pipeline), "cpu", or a
            device.
        num_workers: gather threads (default: this rank's share of the cores).
        drop_last: drop each rank's last incomplete training batch.
        eval_tail: the validation and test loaders' split over DDP ranks: "pad" (default: every rank the same
            number of steps, so collectives inside ``validation_step`` never wait; the repeated windows are marked
            in ``batch["padded"]``, leave them out of metrics) or "uneven" (each window once, ranks differ by at most
            one batch: reduce metrics after the loop, not per step). Training keeps "pad".
        **options: dataset options for every split (label, adjust, normalize, missing, days, embargo, symbols,
            universe, ...) and loader options for every split's loader (order, placement, pool_blocks, config,
            backend, prefetch_factor, collate_fn, ...: :class:`~kline_store.feed.options.LoaderOptions`).

    Attributes:
        loader_options: the loaders' options, built once (each split's loader sets its shuffle, tail and device).
    """

    def __init__(self, store: str | os.PathLike, window: int = 64, splits: dict[str, Range] | None = None,
                 batch_size: int = 256, fields: Sequence[str] | None = None, horizon: int | None = None, seed: int = 0,
                 device: Any = "auto", num_workers: int | None = None, drop_last: bool = False,
                 eval_tail: str = "pad", **options: Any) -> None:
        super().__init__()
        if not splits or "train" not in splits:
            raise InputError("KlineDataModule(splits=...): give at least {'train': (start, end)}")
        unknown = sorted(set(splits) - {"train", "val", "valid", "test"})
        if unknown:
            raise InputError(f"KlineDataModule(splits=...): unknown split(s) {unknown}; use train, val (or valid), "
                             f"test")
        ranges = dict(splits)
        if "valid" in ranges:   # make_splits' name, accepted here too
            if "val" in ranges:
                raise InputError("KlineDataModule(splits=...): 'val' and 'valid' are the same split; give one")
            ranges["val"] = ranges.pop("valid")
        self.store, self.window, self.ranges = store, int(window), ranges
        self.batch_size, self.fields, self.horizon, self.seed = int(batch_size), fields, horizon, seed
        if eval_tail not in ("pad", "uneven"):
            raise InputError(f"KlineDataModule(eval_tail={eval_tail!r}): expected 'pad' or 'uneven'")
        loading, options = split_options(options)
        fixed = sorted(set(loading) & {"shuffle", "tail"})
        if fixed:
            raise InputError(f"KlineDataModule({fixed[0]}=...): training shuffles and pads, validation and test do "
                             f"not shuffle and take eval_tail=")
        self.loader_options = LoaderOptions.of(batch_size=self.batch_size, seed=seed, num_workers=num_workers,
                                               drop_last=drop_last, **loading)
        self.device, self.num_workers, self.drop_last, self.options = device, num_workers, drop_last, options
        self.eval_tail = eval_tail
        self.splits: Splits | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.splits = make_splits(self.store, self.ranges["train"], self.ranges.get("val"),
                                      self.ranges.get("test"), window=self.window, fields=self.fields,
                                      horizon=self.horizon, **self.options)

    def _device(self) -> torch.device:
        if self.device != "auto":
            return torch.device(self.device)
        if self.trainer is not None and self.trainer.strategy.root_device.type == "cuda":
            return self.trainer.strategy.root_device
        return torch.device("cpu")

    def _loader(self, split: str, shuffle: bool) -> KlineLoader | list:
        self.setup()
        assert self.splits is not None
        ds = {"train": self.splits.train, "val": self.splits.valid, "test": self.splits.test}[split]
        if ds is None:
            return []   # Lightning's "no loader": the split was not given
        opts = self.loader_options
        return ds.loader_with(opts.replace(shuffle=shuffle, drop_last=opts.drop_last and split == "train",
                                           device=self._device(), tail="pad" if split == "train" else self.eval_tail))

    def train_dataloader(self) -> KlineLoader | list:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> KlineLoader | list:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> KlineLoader | list:
        return self._loader("test", shuffle=False)
