"""What a dataset offers the loader: the protocols a source implements (:class:`BatchSource` for every order,
:class:`BlockOrderSource` for the block order too), the shape of its batches (:data:`BatchLayout`) and the block
order's sizes. The loader reads a source through these members only, never by probing for others; datasets in
samples/ implement them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

# Shape and dtype of one sample per key: ``{key: (shape of one sample, torch dtype)}``.
BatchLayout = dict[str, tuple[tuple[int, ...], torch.dtype]]

Batch = dict[str, torch.Tensor]

MAX_BLOCK_BYTES = 4 << 20   # the largest block of one row (a symbol's bars) in the block order


def default_pool(batch_size: int) -> int:
    """K: at least 8x the batch size and 1,024 blocks (a batch of b then spans about K (1 - e^(-b/K)) blocks)."""
    return max(1024, 8 * int(batch_size))


class BatchSource(Protocol):
    """What the loader needs from a dataset (KlineDataset, CrossSectionDataset, FeatureWindows)."""

    path: Path

    def __len__(self) -> int: ...

    @property
    def window(self) -> int: ...

    @property
    def version(self) -> int | None:
        """The store version samples are read from (a loader state records it); None when there is none."""
        ...

    @property
    def batch_layout(self) -> BatchLayout | None:
        """Shape and dtype of one sample per key, when all samples have one shape (chunks, reusable buffers);
        None when each batch has its own shape (padded cross-sections): then one batch per gather."""
        ...

    @property
    def block_order_ok(self) -> bool:
        """Whether the source is a :class:`BlockOrderSource` that can take the block order now (calendar windows)."""
        ...

    @property
    def keeps_full_index(self) -> bool:
        """Whether it holds the index of every sample (the uniform order's); False: only a block index, and the
        block order is the default."""
        ...

    def gather_batch(self, indices: np.ndarray, out: Batch | None = None) -> Batch: ...

    def resident(self, device: torch.device, pin: bool = False) -> Callable[[torch.Tensor], Batch]:
        """Copy what samples read to ``device`` once; returns ``gather(positions) -> batch`` running there."""
        ...

    def resident_nbytes(self) -> int: ...

    def sample_digest(self) -> str:
        """The number of samples and a checksum of what they come from: what the ranks compare before the first
        step (the same on ranks whose datasets hold the same samples)."""
        ...

    def recount(self) -> None:
        """Count the samples again from the store, not trusting a cache (the ranks disagreed)."""
        ...


class BlockOrderSource(BatchSource, Protocol):
    """A source the block order can read (``block_order_ok``): its samples in segments of rows, read ahead and
    released a block (a run of segments) at a time."""

    def block_segments(self) -> tuple[np.ndarray, int]:
        """Valid samples per segment ``[rows, segments]`` (positions as ``self[i]``) and a segment's bytes."""
        ...

    def block_defaults(self, batch_size: int) -> tuple[int, int]:
        """The default pool of live blocks for ``batch_size``, and the largest block's bytes."""
        ...

    def prefetch_segments(self, row: int, k0: int, k1: int) -> None: ...

    def release_segments(self, row: int, k0: int, k1: int) -> None: ...

    def read_bytes(self) -> int:
        """Bytes of the store samples read (what the page cache holds in the uniform order)."""
        ...

    def full_index_bytes(self) -> int:
        """Bytes of building the full index (when ``keeps_full_index`` is False)."""
        ...

    def full_index(self) -> np.ndarray:
        """Build and keep the full index (the uniform order over a source that kept only blocks)."""
        ...


__all__ = ["MAX_BLOCK_BYTES", "Batch", "BatchLayout", "BatchSource", "BlockOrderSource", "default_pool"]


def __getattr__(name: str):
    """``Layout``: the old name of :data:`BatchLayout` (three classes were called Layout), still importable."""
    if name == "Layout":
        import warnings
        warnings.warn("kline_store.feed.source.Layout is now BatchLayout", DeprecationWarning, stacklevel=2)
        return BatchLayout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
