"""The store's public API in one place: the read side (snapshot.py) and the write side (writer.py).

``from kline_store.store import open_store, Store, create_store`` is what other modules and users import;
the implementation lives in the two modules below, which never import this one.
"""

from __future__ import annotations

from .snapshot import AUTO_VERIFY_BYTES, STAGING, Store, Verification, open_store, verify, verify_store
from .writer import create_store, default_capacity, gc

__all__ = ["AUTO_VERIFY_BYTES", "STAGING", "Store", "Verification", "create_store", "default_capacity", "gc",
           "open_store", "verify", "verify_store"]
