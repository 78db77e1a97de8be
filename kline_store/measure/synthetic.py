"""Synthetic K-line stores for benchmarks: random-walk OHLCV bars with late listings and suspensions, of a given size.

Benchmarks measure on data bigger than the CPU cache (a store that fits in L3 flatters every loader); this module
makes such a store when the user's own is small, and reads the cache size to decide.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..store import create_store

FIELDS = ("open", "high", "low", "close", "volume", "amount")


def l3_bytes() -> int:
    """The largest CPU cache (L3 on most machines) in bytes; 32 MiB when it cannot be read."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or 32 << 20


def shape_for(nbytes: int, n_dates: int = 2500, n_fields: int = len(FIELDS)) -> tuple[int, int, int]:
    """``(symbols, dates, fields)`` of a store of at least ``nbytes`` float32 cells, ``n_dates`` days long."""
    cell = n_dates * n_fields * 4
    return max(1, -(-nbytes // cell)), n_dates, n_fields


def make_store(path: str | os.PathLike, n_symbols: int, n_dates: int = 2500, seed: int = 0,
               start: str = "2010-01-04") -> Path:
    """Write a store of ``n_symbols`` random-walk symbols over ``n_dates`` consecutive days (six fields).

    About one symbol in five lists late and one in seventeen has a suspension of up to 40 days, so windows are
    not all valid, as in real data. Written a block of symbols at a time (bounded memory).
    """
    rng = np.random.default_rng(seed)
    panel = np.empty((n_symbols, n_dates, len(FIELDS)), dtype=np.float32)
    for lo in range(0, n_symbols, 256):
        hi = min(n_symbols, lo + 256)
        shape = (hi - lo, n_dates)
        close = (10 * np.exp(np.cumsum(rng.normal(0, 0.02, shape), axis=1))).astype(np.float32)
        opens = close * (1 + rng.normal(0, 0.005, shape)).astype(np.float32)
        volume = rng.integers(1_000, 100_000, shape).astype(np.float32)
        panel[lo:hi] = np.stack([opens, np.maximum(opens, close) * 1.01, np.minimum(opens, close) * 0.99, close,
                                 volume, volume * close], axis=2)
    late = rng.random(n_symbols) < 0.2
    for s in np.flatnonzero(late):
        panel[s, : rng.integers(1, n_dates // 2)] = np.nan
    for s in range(0, n_symbols, 17):
        a = int(rng.integers(0, max(1, n_dates - 50)))
        panel[s, a: a + int(rng.integers(1, 40))] = np.nan
    dates = np.datetime64(start, "D") + np.arange(n_dates)
    return create_store(path, panel, [f"S{i:05d}" for i in range(n_symbols)], dates, list(FIELDS))
