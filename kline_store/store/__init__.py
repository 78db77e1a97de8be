"""The store on disk and its guards: the format (manifest, checksums, universes), the writer lock, the read side
(snapshot: a pinned, verified version; labels read on their day) and the write side (staging, commit, gc), the
time axis and sessions.

May import: kline_store.errors, kline_store.progress. Nothing above it (ingest, features, feed, samples, ...)
is imported here: every other wing reads and writes through this one.

The store's public API in one place: ``from kline_store.store import open_store, Store, create_store`` is what
other wings and users import, and writers of other wings take the write transaction from here
(``NewVersion``, ``TailAppend``: transaction.py; ``whole_store``, ``collect``); snapshot.py (read side),
writer.py and transaction.py (write side) never import this file.
"""

from __future__ import annotations

from .snapshot import AUTO_VERIFY_BYTES, STAGING, Store, Verification, open_store, verify, verify_store
from .writer import (bar_extent, clean_failed_write, clean_staging, collect, create_store, default_capacity, gc, prepare,
                     whole_store)
from .transaction import NewVersion, TailAppend, edit_manifest

__all__ = ["AUTO_VERIFY_BYTES", "STAGING", "NewVersion", "Store", "TailAppend", "Verification", "bar_extent",
           "clean_failed_write", "clean_staging", "collect", "create_store", "default_capacity", "edit_manifest", "gc",
           "open_store", "prepare", "verify", "verify_store", "whole_store"]
