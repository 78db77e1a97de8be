"""A new data file and the writes into one: generations in staging, tail appends, the numbers a write takes, and
the crash points of the kill -9 tests. Hold the writer lock.

A new generation is a sparse file created in ``.staging``: the bytes a version will see (each row's first
``n_dates`` days) are reserved with ``posix_fallocate`` before anything is written, then rows are written
with ``pwrite``, never through a mapping. So a full disk is one StoreError at the start (naming the store and
the bytes needed), never a SIGBUS, and the reserved room after each row's last day stays a hole. A tail append
writes into the current data file only where no committed version looks. The transaction that publishes
either (transaction.py) is what writers use.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Iterator

import numpy as np

from . import manifest as mf, safefs
from ..errors import InputError, StoreError
from ..progress import Progress
from .snapshot import STAGING


def crashpoint(name: str) -> None:
    """Fault injection for the crash-safety tests: SIGKILL this process at the named point of a write.

    Active only when the environment variable KLINE_STORE_CRASH_AT equals ``name``.
    """
    if os.environ.get("KLINE_STORE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def staging_dir(store_dir: Path) -> Path:
    """The writer's scratch folder, created if missing; a symlink there is refused."""
    with safefs.guard(store_dir, "create the staging folder"):
        return safefs.make_dir(store_dir / STAGING)


def default_capacity(n_dates: int) -> int:
    """Room for ~10 years of daily appends (or doubling, for long histories) before a rewrite."""
    return n_dates + max(2520, n_dates)


class NewGeneration:
    """A data file being written in staging: sparse, the logical bytes reserved up front, rows pwritten.

    Args:
        store_dir: the store (its staging folder receives the file).
        generation: the file's generation number.
        rows, n_dates, n_fields: the shape a version will see; ``capacity`` days are reserved per row.
    """

    def __init__(self, store_dir: Path, generation: int, rows: int, n_dates: int, n_fields: int,
                 capacity: int | None = None) -> None:
        cap = capacity or default_capacity(n_dates)
        if cap < n_dates:
            raise InputError(f"capacity={cap} is below the {n_dates} dates to store")
        self.store_dir, self.generation = store_dir, generation
        self.rows, self.n_dates, self.n_fields, self.capacity = rows, n_dates, n_fields, cap
        self.stride = cap * n_fields * 4                        # bytes per symbol row in the file
        self.size = rows * self.stride
        self.path = staging_dir(store_dir) / mf.data_file_name(generation)
        self.crcs = np.zeros(rows, dtype=np.uint32)
        self.fd: int | None = None
        self.progress: Progress | None = None
        with safefs.guard(store_dir, f"create {self.path.name}", self.size):
            self.fd = safefs.open_entry(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            os.ftruncate(self.fd, self.size)                    # sparse: no block is allocated yet
        row_bytes = n_dates * n_fields * 4
        try:
            safefs.reserve(self.fd, [(r * self.stride, row_bytes) for r in range(rows)])
        except OSError as exc:
            self.abort()          # first, so the message counts the space a partial reservation held
            raise safefs.os_error(exc, store_dir, f"write {self.path.name}", rows * row_bytes) from None
        except BaseException:
            self.abort()
            raise
        self.progress = Progress(rows, "writing", unit="symbols")   # symbol rows built, written and checksummed

    def write(self, lo: int, block: np.ndarray) -> None:
        """Write rows ``lo .. lo + len(block)`` (each [n_dates, n_fields] float32) and checksum them."""
        block = np.ascontiguousarray(block, dtype=np.float32)
        assert block.shape[1:] == (self.n_dates, self.n_fields), block.shape
        with safefs.guard(self.store_dir, f"write {self.path.name}", block.nbytes):
            for i in range(block.shape[0]):
                safefs.write_all(self.fd, block[i].data, (lo + i) * self.stride)
        self.crcs[lo: lo + block.shape[0]] = mf.row_crcs(block)
        if self.progress is not None:
            self.progress.step(block.shape[0])

    def finish(self) -> dict:
        """Flush the file to disk and move it into the store; returns the manifest's ``data`` entry."""
        if self.progress is not None:
            self.progress.close()
        final = self.store_dir / self.path.name
        with safefs.guard(self.store_dir, f"write {self.path.name}"):
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None
            os.replace(self.path, final)
            safefs.fsync_dir(self.store_dir)
        return {"file": final.name, "generation": self.generation, "rows": self.rows, "size": self.size,
                "row_crc32": self.crcs.tolist(), "checksum": mf.file_checksum(self.crcs)}

    def abort(self) -> None:
        """Close and remove the staging file (a failure path)."""
        if self.progress is not None:
            self.progress.close()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            os.unlink(self.path)
        except OSError:
            pass


def next_numbers(store_dir: Path) -> tuple[int, int, str | None]:
    """(last version, last generation, created_at) of the store at ``store_dir`` (zeros when there is none).

    At least as high as any version copy or data file name present: a damaged manifest being replaced
    (``ingest --replace``) must not reuse a number a reader may still pin.
    """
    version, generation, created = 0, 0, None
    try:
        m = mf.read_manifest(store_dir)
        version, generation, created = m["version"], m["data"]["generation"], m.get("created_at")
    except StoreError:
        pass
    for p in store_dir.iterdir() if store_dir.is_dir() else ():
        got = mf.DATA_FILE_RE.fullmatch(p.name)
        if got:
            generation = max(generation, int(got.group(1)))
    vdir = store_dir / mf.VERSIONS_DIR
    if vdir.is_dir() and not vdir.is_symlink():
        for p in vdir.iterdir():
            got = mf.VERSION_FILE_RE.fullmatch(p.name)
            if got:
                version = max(version, int(got.group(1)))
    return version, generation, created


def tail_ranges(stride: int, cell: int, n_old_rows: int, n_rows: int, n_old: int, n_new: int) -> list[tuple[int, int]]:
    """Byte ranges a tail append writes: the new days of the old rows, then whole new rows."""
    ranges = [(r * stride + n_old * cell, (n_new - n_old) * cell) for r in range(n_old_rows)] if n_new > n_old else []
    return ranges + [(r * stride, n_new * cell) for r in range(n_old_rows, n_rows)]


@contextlib.contextmanager
def tail_append(store_dir: Path, path: Path, size: int, ranges: list[tuple[int, int]],
                pinned: tuple[int, int] | None = None, crash: str = "tail") -> Iterator[int]:
    """The data file open for writing where no committed version looks (hold the lock): grown to ``size`` bytes
    (sparse), ``ranges`` reserved; the body pwrites; then fsync, so the data is durable before the manifest that
    shows it. On failure the file is cut back to its size (no version sees beyond it) and an OS error is one
    line. ``pinned``: (device, inode) of the file the caller read (Store.data_file_identity), which must still be
    this one."""
    need = sum(length for _, length in ranges)
    with safefs.guard(store_dir, f"append to {path.name}", need):
        fd = safefs.open_entry(path, os.O_RDWR)
    try:
        if pinned is not None and (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != tuple(pinned):
            raise StoreError(f"{path}: the data file was replaced during the append; nothing was written")
        size0 = os.fstat(fd).st_size
        try:
            if size0 < size:
                os.ftruncate(fd, size)          # sparse: new rows cost nothing until written
            crashpoint(f"{crash}:grown")
            safefs.reserve(fd, ranges)
            crashpoint(f"{crash}:cleared")
            yield fd
            crashpoint(f"{crash}:written")
            os.fsync(fd)
        except BaseException as exc:
            if os.fstat(fd).st_size > size0:
                os.ftruncate(fd, size0)
            if isinstance(exc, OSError):
                raise safefs.os_error(exc, store_dir, f"append to {path.name}", need) from None
            raise
    finally:
        os.close(fd)
