"""kline-store: K-line (OHLCV bar) files, daily to monthly or intraday -> memory-mapped float32 store -> features
-> fast, leakage-safe training batches.

Importing the package does not import torch; the dataset and loader names load it on first use.
"""

from __future__ import annotations

from typing import Any

from .errors import InputError, KlineStoreError, StoreError, StoreLockedError
from .store import Store, open_store, verify_store

# The wing kline_store.ingest shares its name with the function ks.ingest. Loading the (light) wing package
# here, once, means no later submodule import rebinds the name: ks.ingest stays the function below.
from . import ingest as _ingest_wing  # noqa: F401

del ingest

__version__ = "0.1.0"

_LAZY = {
    "ingest": ("kline_store.ingest.ingestion", "ingest"),
    "append": ("kline_store.ingest.update", "append"),
    "export": ("kline_store.ingest.exporter", "export"),
    "set_universe": ("kline_store.ingest.universes_in", "set_universe"),
    "gc": ("kline_store.store.writer", "gc"),
    "KlineDataset": ("kline_store.samples.dataset", "KlineDataset"),
    "CrossSectionDataset": ("kline_store.samples.cross_section", "CrossSectionDataset"),
    "make_splits": ("kline_store.samples.splits", "make_splits"),
    "Splits": ("kline_store.samples.splits", "Splits"),
    "gather_windows": ("kline_store.samples.gather", "gather_windows"),
    "KlineLoader": ("kline_store.feed.loader", "KlineLoader"),
    "watch": ("kline_store.measure.meter", "watch"),
    "compute_features": ("kline_store.features.compute", "compute_features"),
    "update_features": ("kline_store.features.compute", "update_features"),
    "feature_set": ("kline_store.features.sets", "feature_set"),
    "process_features": ("kline_store.features.process", "process_features"),
    "FeatureWindows": ("kline_store.samples.feature_windows", "FeatureWindows"),
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
