"""kline-store: daily K-line files -> memory-mapped float32 store -> fast, leakage-safe training batches.

Importing the package does not import torch; the dataset and loader names load it on first use.
"""

from __future__ import annotations

from typing import Any

from .errors import InputError, KlineStoreError, StoreError, StoreLockedError
from .store import Store, open_store, verify_store

__version__ = "0.1.0"

_LAZY = {
    "ingest": ("kline_store.ingestion", "ingest"),
    "append": ("kline_store.update", "append"),
    "export": ("kline_store.exporter", "export"),
    "gc": ("kline_store.writer", "gc"),
    "KlineDataset": ("kline_store.dataset", "KlineDataset"),
    "CrossSectionDataset": ("kline_store.cross_section", "CrossSectionDataset"),
    "make_splits": ("kline_store.splits", "make_splits"),
    "Splits": ("kline_store.splits", "Splits"),
    "gather_windows": ("kline_store.gather", "gather_windows"),
    "KlineLoader": ("kline_store.loader", "KlineLoader"),
    "watch": ("kline_store.meter", "watch"),
}

__all__ = ["open_store", "verify_store", "Store", "KlineStoreError", "InputError", "StoreError",
           "StoreLockedError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kline_store' has no attribute {name!r}")
