"""The width of index arrays: every wing that keeps millions of positions (the dataset's windows, the loader's
orders, the footprint estimate) sizes them alike."""

from __future__ import annotations

import numpy as np


def index_dtype(n: int) -> np.dtype:
    """The narrowest of int32 / int64 that holds ``0..n-1``: index arrays of millions of windows are a
    memory cost per process (and per rank), so they take 4 bytes an entry where that suffices."""
    return np.dtype(np.int32) if n <= np.iinfo(np.int32).max else np.dtype(np.int64)


__all__ = ["index_dtype"]
