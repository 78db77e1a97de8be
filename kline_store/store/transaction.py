"""One write transaction: the crash-safe sequence every writer of a version goes through. Hold the writer lock.

A new version (``NewVersion``): numbers -> a new generation in staging -> rows written -> ``{crash}:filled``
-> the file moved into the store -> ``{crash}:data-in-place`` -> manifest built and committed
(``commit:copied``, ``commit:manifest-swapped``, ``commit:done``). On any failure the staging file is removed,
or the data file moved in but never committed is; the current version stays.

A manifest edit (``edit_manifest``): the next version over the same data file (``{crash}:edited``, then the
commit's points).

A tail append (``TailAppend``): new days of stored rows and whole new rows written into the current data file
where no committed version looks (``{crash}:grown``, ``{crash}:cleared``, ``{crash}:written``), fsync'd, then the
manifest that shows them is committed. On failure the file is cut back to its size.

The ``crash`` prefix names the writer (``ingest``, ``rewrite``, ``qlib``, ``features``, ``process``, ``tail``,
``features:tail``, ...) so the kill -9 tests (``KLINE_STORE_CRASH_AT``) can stop each writer at each step.
Collecting unused files after the commit is the caller's (``collect``, or in the background).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from . import identity, manifest as mf, safefs, timeaxis
from ..errors import StoreError
from .generation import NewGeneration, crashpoint, next_numbers, tail_append, tail_ranges


def build_manifest(*, version: int, data: dict, symbols: Sequence[str], dates: np.ndarray, fields: Sequence[str],
                   capacity: int, first_bar: np.ndarray, last_bar: np.ndarray, n_bars: int,
                   sources: Iterable[dict] = (), created_at: str | None = None, extra: dict | None = None) -> dict:
    freq = (extra or {}).get("freq", timeaxis.DAILY)
    dates_iso = timeaxis.iso(np.asarray(dates).astype(f"datetime64[{timeaxis.unit(freq)}]"))
    m = {
        "format": mf.FORMAT, "format_version": mf.FORMAT_VERSION, "version": version,
        "created_at": created_at or mf.now_iso(), "updated_at": mf.now_iso(),
        "dtype": "float32", "layout": "[symbol, date, field] symbol-major, fields innermost, row stride "
                                       "date_capacity*n_fields",
        "shape": {"n_symbols": len(symbols), "n_dates": len(dates), "n_fields": len(fields),
                  "date_capacity": capacity},
        "fields": list(fields), "symbols": list(symbols), "calendar": dates_iso,
        "first_bar": [int(x) for x in first_bar], "last_bar": [int(x) for x in last_bar],
        "first_date": [dates_iso[i] if i >= 0 else None for i in first_bar],
        "last_date": [dates_iso[i] if i >= 0 else None for i in last_bar],
        "n_bars": int(n_bars), "data": data, "sources": list(sources),
        "freq": freq, "timezone": "exchange-local, naive",
    }
    if extra:
        m.update(extra)
    return m


def commit(store_dir: Path, manifest: dict) -> dict:
    """Publish a version: its copy under versions/, then the atomic, durable swap of manifest.json.

    The copy comes first so a reader of the current version always finds one to pin; a crash between the
    two leaves a copy of a version that was never committed, which readers refuse (it is newer than
    manifest.json) and the next writer removes. Returns the manifest as published (with its checksum).
    """
    if manifest.get(mf.STORE_ID_KEY) is None:       # an append, a revision: the id carries over (identity.py)
        manifest = {**manifest, mf.STORE_ID_KEY: identity.current_id(store_dir) or mf.new_store_id()}
    m = mf.seal(manifest)
    mf.check_manifest(m, store_dir / mf.MANIFEST)   # never publish a manifest that would not open
    raw = mf.encode(m)
    with safefs.guard(store_dir, "write the manifest", 2 * len(raw)):
        vdir = safefs.make_dir(store_dir / mf.VERSIONS_DIR)
        # Not fsync'd: if a power loss takes this copy, readers of the current version use manifest.json.
        safefs.write_atomic(vdir / mf.version_file_name(m["version"]), raw, durable=False)
        crashpoint("commit:copied")
        safefs.write_atomic(store_dir / mf.MANIFEST, raw)
    crashpoint("commit:manifest-swapped")
    crashpoint("commit:done")
    return m


def edit_manifest(store_dir: Path, m: dict, changes: dict[str, Any], *, crash: str) -> dict:
    """Publish the next version with the manifest changed only (a universe set or removed): the same data file.

    ``m``: the current manifest, read under the writer lock after ``prepare`` (so no uncommitted copy holds the
    next number); ``changes``: keys to set, or to remove where the value is None. Crash points
    ``{crash}:edited``, then commit's. Returns the manifest as published.
    """
    new = {k: v for k, v in m.items() if k != mf.CHECKSUM_KEY}
    new.update(version=m["version"] + 1, updated_at=mf.now_iso())
    for key, value in changes.items():
        if value is None:
            new.pop(key, None)
        else:
            new[key] = value
    crashpoint(f"{crash}:edited")
    return commit(store_dir, new)


def discard_uncommitted(store_dir: Path, data_name: str | None) -> None:
    """After a failed write: remove a data file moved into the store that no committed manifest uses."""
    if not data_name:
        return
    try:
        if mf.read_manifest(store_dir)["data"]["file"] == data_name:
            return
    except StoreError:
        pass
    try:
        os.unlink(store_dir / data_name)
    except OSError:
        pass


class NewVersion:
    """A context manager writing the next version of a store as a new generation of its data file.

    Args:
        store_dir: the store (under the caller's writer lock).
        rows, n_dates, n_fields: the shape the version holds; ``capacity`` days are reserved per row.
        crash: the writer's name in its crash points (``{crash}:filled``, ``{crash}:data-in-place``).
        after: the manifest this version follows (its version and generation + 1, its ``created_at``);
            None: the numbers on disk (``next_numbers``: never reusing a number a reader may pin).

    ``write``/``write_panel`` the rows, then ``commit(**manifest fields)``; ``version``, ``created_at`` and
    ``capacity`` are known on entry.
    """

    def __init__(self, store_dir: Path, rows: int, n_dates: int, n_fields: int, capacity: int | None = None, *,
                 crash: str, after: dict | None = None) -> None:
        if after is None:
            version, generation, self.created_at = next_numbers(store_dir)
        else:
            version, generation = after["version"], after["data"]["generation"]
            self.created_at = after.get("created_at")
        self.store_dir, self.version, self.generation = store_dir, version + 1, generation + 1
        self.shape, self.requested_capacity, self.crash = (rows, n_dates, n_fields), capacity, crash
        self.gen: NewGeneration | None = None
        self.data: dict | None = None
        self.manifest: dict | None = None

    def __enter__(self) -> NewVersion:
        self.gen = NewGeneration(self.store_dir, self.generation, *self.shape, self.requested_capacity)
        return self

    @property
    def capacity(self) -> int:
        return self.gen.capacity

    def write(self, lo: int, block: np.ndarray) -> None:
        """Rows ``lo .. lo + len(block)``, each [n_dates, n_fields] float32, written and checksummed."""
        self.gen.write(lo, block)

    def write_panel(self, panel: np.ndarray, block_rows: int = 256) -> None:
        """The whole panel [rows, n_dates, n_fields], a block of rows at a time."""
        for lo in range(0, panel.shape[0], block_rows):
            self.gen.write(lo, panel[lo: lo + block_rows])

    def finish(self) -> dict:
        """The data file flushed and moved into the store; returns the manifest's ``data`` entry."""
        crashpoint(f"{self.crash}:filled")
        self.data = self.gen.finish()
        crashpoint(f"{self.crash}:data-in-place")
        return self.data

    def commit(self, **fields: Any) -> dict:
        """Build the manifest (``build_manifest``'s keywords but version, data and capacity) and publish it;
        returns it as published."""
        if self.data is None:
            self.finish()
        m = build_manifest(version=self.version, data=self.data, capacity=self.gen.capacity, **fields)
        self.manifest = commit(self.store_dir, m)
        return self.manifest

    def __exit__(self, kind, exc, tb) -> None:
        if self.manifest is not None:
            return
        if self.data is None:
            self.gen.abort()                    # the staging file
        else:
            discard_uncommitted(self.store_dir, self.data["file"])    # moved in, never committed


class TailAppend:
    """A context manager appending to the current data file where no committed version looks.

    Args:
        store_dir: the store (under the caller's writer lock).
        m: the current manifest (its data file, row checksums, date capacity, version).
        n_rows, n_dates, n_fields: the shape the new version holds (rows and days only grow).
        pinned: (device, inode) of the data file the caller read (``Store.data_file_identity()``), which must
            still be this one.
        crash: the writer's name in its crash points (``{crash}:grown``, ``:cleared``, ``:written``).

    Inside, ``write(lo, cells, day0)`` the cells; after the block (the file fsync'd), ``commit(**fields)``.
    """

    def __init__(self, store_dir: Path, m: dict, n_rows: int, n_dates: int, n_fields: int, *,
                 pinned: tuple[int, int] | None = None, crash: str) -> None:
        self.store_dir, self.old, self.n_rows = store_dir, m, n_rows
        self.capacity = m["shape"]["date_capacity"]
        self.stride, self.cell = self.capacity * n_fields * 4, n_fields * 4
        n_old_rows, n_old = m["shape"]["n_symbols"], m["shape"]["n_dates"]
        self.ranges = tail_ranges(self.stride, self.cell, n_old_rows, n_rows, n_old, n_dates)
        self.crcs = np.concatenate([np.asarray(m["data"]["row_crc32"][:n_old_rows], dtype=np.uint32),
                                    np.zeros(n_rows - n_old_rows, dtype=np.uint32)])
        self.path, self.pinned, self.crash = store_dir / m["data"]["file"], pinned, crash
        self.fd: int | None = None
        self._open = None

    def __enter__(self) -> TailAppend:
        self._open = tail_append(self.store_dir, self.path, self.n_rows * self.stride, self.ranges,
                                 pinned=self.pinned, crash=self.crash)
        self.fd = self._open.__enter__()
        return self

    def write(self, lo: int, cells: np.ndarray, day0: int) -> None:
        """Rows ``lo .. lo + len(cells)`` from day ``day0`` on (each [days, n_fields] float32); checksums
        extended."""
        for i in range(cells.shape[0]):
            safefs.write_all(self.fd, cells[i].data, (lo + i) * self.stride + day0 * self.cell)
        self.crcs[lo: lo + cells.shape[0]] = mf.row_crcs(cells, self.crcs[lo: lo + cells.shape[0]])

    def __exit__(self, kind, exc, tb) -> bool:
        self.fd, opened, self._open = None, self._open, None
        return opened.__exit__(kind, exc, tb)

    def commit(self, **fields: Any) -> dict:
        """After the block: the manifest showing the appended cells (``build_manifest``'s keywords but
        version, data and capacity; ``created_at`` defaults to the store's), published."""
        data = dict(self.old["data"], rows=self.n_rows, size=self.n_rows * self.stride,
                    row_crc32=self.crcs.tolist(), checksum=mf.file_checksum(self.crcs))
        fields.setdefault("created_at", self.old.get("created_at"))
        m = build_manifest(version=self.old["version"] + 1, data=data, capacity=self.capacity, **fields)
        return commit(self.store_dir, m)


__all__ = ["NewVersion", "TailAppend", "build_manifest", "commit", "discard_uncommitted"]
