"""Batch structure helpers: count samples, apply a function to every tensor, cut a chunk into batches.

A batch is a tensor or any nesting of tuples, lists, namedtuples and dicts of tensors (a KlineDataset batch is a
dict). No torch import: anything with ``shape`` and ``__getitem__`` counts as a tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any


def batch_length(batch: Any) -> int:
    """Number of samples in a batch of any common shape.

    Tensors and arrays count their first dimension; tuples, lists and dicts count their first element (so
    ``(x, y)`` and ``{"x": x, "y": y}`` both count ``len(x)``); anything else with ``len()`` counts that.

    Returns:
        The number of samples, 1 when nothing better is known.
    """
    for _ in range(8):  # bounded descent into nested containers
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else 1
        if isinstance(batch, dict):
            if not batch:
                return 0
            batch = next(iter(batch.values()))
        elif isinstance(batch, (tuple, list)):
            if not batch:
                return 0
            first = batch[0]
            if isinstance(first, (int, float, str, bytes)):  # a list of scalars is a batch of them
                return len(batch)
            batch = first
        else:
            try:
                return len(batch)
            except TypeError:
                return 1
    return 1


def map_tensors(fn: Callable[[Any], Any], batch: Any) -> Any:
    """Apply ``fn`` to every tensor in a batch, keeping the structure."""
    if isinstance(batch, tuple):
        if hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*(map_tensors(fn, b) for b in batch))
        return tuple(map_tensors(fn, b) for b in batch)
    if isinstance(batch, list):
        return [map_tensors(fn, b) for b in batch]
    if isinstance(batch, dict):
        return {k: map_tensors(fn, v) for k, v in batch.items()}
    if hasattr(batch, "shape") and hasattr(batch, "__getitem__"):
        return fn(batch)
    return batch


def leaves(batch: Any) -> list[Any]:
    """Every tensor of a batch, in structure order."""
    out: list[Any] = []
    map_tensors(out.append, batch)
    return out


def slices(chunk: Any, sizes: Sequence[int]) -> Iterator[tuple[Any, int]]:
    """Cut a chunk gathered for several batches back into them (views, no copy); yields ``(batch, size)``."""
    if len(sizes) == 1:
        yield chunk, sizes[0]
        return
    start = 0
    if isinstance(chunk, dict) and all(hasattr(v, "split") for v in chunk.values()):
        # The common case (a KlineDataset dict): one split per key makes all the views in one call.
        keys = list(chunk)
        for n, views in zip(sizes, zip(*(v.split(list(sizes)) for v in chunk.values()))):
            yield dict(zip(keys, views)), n
        return
    for n in sizes:
        a, b = start, start + n
        yield map_tensors(lambda t, a=a, b=b: t[a:b], chunk), n
        start = b
