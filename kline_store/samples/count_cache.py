"""The per-user cache of block counts (``samples/blocks.py``'s segment counts, ``day_blocks.py``'s day counts).

Counting the valid windows of a store is one pass over it; the counts are kept in ``$KLINE_STORE_CACHE/blocks``
(default ``~/.cache/kline-store/blocks``), keyed by the store's identity and the sample plan, so that another
process, rank or restart loads them instead of counting again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .spec import SamplePlan


def cache_dir() -> Path:
    """Where segment counts are kept between processes: ``$KLINE_STORE_CACHE`` or ``~/.cache/kline-store``."""
    return Path(os.environ.get("KLINE_STORE_CACHE") or Path.home() / ".cache" / "kline-store") / "blocks"


def cache_key(store: Any, plan: SamplePlan, *extra: Any) -> str:
    """The cache file name of counts over ``store`` (path, version, checksums) for ``plan`` and ``extra``."""
    m = store.manifest
    ident = [str(Path(store.path).resolve()), store.version, m.get("manifest_checksum"), m["data"].get("file"),
             m["data"].get("checksum"), repr(plan), *extra]
    return hashlib.sha256(json.dumps(ident, default=str).encode()).hexdigest()[:32]


T = TypeVar("T")


def cached(path: Path, load: Callable[[Path], T | None], build: Callable[[], T],
           save: Callable[[Path, T], None]) -> T:
    """``load(path)``, else ``build()`` and ``save`` it, holding a lock beside ``path`` while building: the ranks
    of a node started together build once and the others load its result. No cache is no error."""
    got = load(path)
    if got is not None:
        return got
    lock = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX)
        got = load(path)
    except OSError:
        pass
    try:
        if got is None:
            got = build()
            save(path, got)
    finally:
        if lock is not None:
            os.close(lock)
    return got


def load_arrays(path: Path, names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The arrays ``names`` of an ``.npz`` file, or None when it cannot be read (a missing cache is no error)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {n: z[n] for n in names}
    except (OSError, KeyError, ValueError):
        return None


def save_arrays(path: Path, **arrays: Any) -> None:
    """An ``.npz`` written atomically (a temporary file renamed over); a cache that cannot be written is no error."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


__all__ = ["cache_dir", "cache_key", "cached", "load_arrays", "save_arrays"]
