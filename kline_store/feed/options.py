"""LoaderOptions: every option of the loader as one frozen object.

The entry points that make a loader (``KlineDataset.loader``, ``CrossSectionDataset.loader``,
``FeatureWindows.loader``, ``KlineDataModule``) keep their keywords, build this object once and pass it whole to
:class:`~kline_store.feed.loader.KlineLoader`; nothing forwards a keyword list by hand, so an option added here
reaches every one of them (tests/feed/test_options.py introspects their signatures against these fields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..errors import InputError
from .sampling import Tail

# DataLoader keywords accepted for familiarity (the classic recipe passes them as they are).
DATALOADER_KEYWORDS = ("prefetch_factor", "pin_memory", "persistent_workers", "collate_fn", "worker_init_fn",
                       "multiprocessing_context", "timeout", "in_order", "pin_memory_device")


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """The loader's options; see :class:`~kline_store.feed.loader.KlineLoader` for what each one means. A
    DataLoader keyword left at None is not given (the tuned or default configuration decides)."""

    batch_size: int = 256
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    num_workers: int | None = None
    rank: int | None = None
    world_size: int | None = None
    tail: Tail = "pad"
    device: Any = None
    placement: str = "auto"
    config: Any = None
    backend: str | None = None
    order: str = "auto"
    pool_blocks: int | None = None
    block_bytes: int | None = None
    prefetch_factor: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    collate_fn: Callable[..., Any] | None = None
    worker_init_fn: Callable[[int], Any] | None = None
    multiprocessing_context: Any = None
    timeout: float | None = None
    in_order: bool = True
    pin_memory_device: str | None = None

    @classmethod
    def of(cls, **keywords: Any) -> LoaderOptions:
        """Options from keywords; an unknown one is refused in one line."""
        check_names(keywords)
        return cls(**keywords)

    def replace(self, **keywords: Any) -> LoaderOptions:
        """These options with ``keywords`` changed."""
        check_names(keywords)
        return dataclasses.replace(self, **keywords)

    def dataloader_keywords(self) -> dict[str, Any]:
        """The DataLoader keywords that were given (not None)."""
        return {k: getattr(self, k) for k in DATALOADER_KEYWORDS if getattr(self, k) is not None}


NAMES = frozenset(f.name for f in dataclasses.fields(LoaderOptions))


def check_names(keywords: dict[str, Any]) -> None:
    unknown = sorted(set(keywords) - NAMES)
    if unknown:
        hint = (" (the loader makes its own batches from batch_size, shuffle, seed and drop_last)"
                if set(unknown) & {"sampler", "batch_sampler", "generator"} else "")
        raise InputError(f"loader(): unknown argument(s) {', '.join(unknown)}{hint}")


def split_options(keywords: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``keywords`` as (the loader's, the rest): for an entry point that takes both kinds in one ``**options``."""
    return ({k: v for k, v in keywords.items() if k in NAMES},
            {k: v for k, v in keywords.items() if k not in NAMES})


__all__ = ["DATALOADER_KEYWORDS", "LoaderOptions", "split_options"]
