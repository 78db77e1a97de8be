"""The write side of a store around the transaction: preparing a store for a writer (a killed writer's staging
cleaned, the current version's copy restored, copies of versions never committed removed), whole-store writes
and their clean-up, ``create_store`` and gc. Hold the writer lock.

The write sequence itself (a new generation or a tail append, its crash points, the manifest's commit) is in
transaction.py, on generation.py; the names it had here are kept (``writer.NewGeneration``, ``writer.commit``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from . import lock, manifest as mf, safefs, timeaxis
from ..errors import InputError, StoreError, StoreLockedError
# NewGeneration, staging_dir and commit are also kept here under their old names (writer.NewGeneration, ...).
from .generation import NewGeneration, default_capacity, staging_dir  # noqa: F401
from .snapshot import STAGING
from .transaction import NewVersion, commit  # noqa: F401


def clean_staging(store_dir: Path) -> None:
    """Remove what a killed or failed writer left: staging and half-written manifests. Hold the lock."""
    staging = store_dir / STAGING
    with safefs.guard(store_dir, "remove the staging folder"):
        if safefs.check_dir(staging):
            shutil.rmtree(staging)          # removes links inside it, never what they point to
        tmps = list(store_dir.glob(f".{mf.MANIFEST}.tmp-*"))
        vdir = store_dir / mf.VERSIONS_DIR
        if safefs.check_dir(vdir):
            tmps += list(vdir.glob(".v*.tmp-*"))
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


def prepare(store_dir: Path, m: dict | None = None) -> dict | None:
    """What every writer does first, under the lock: clean up after a killed writer, restore the current
    version's copy, remove copies of versions that were never committed. Returns the current manifest (None
    when there is none or it is damaged: only ``ingest --replace`` goes on from there); ``m``: the current
    manifest when the caller has just read it."""
    clean_staging(store_dir)
    if m is None:
        try:
            m = mf.read_manifest(store_dir)
        except StoreError:
            return None
    vdir = store_dir / mf.VERSIONS_DIR
    with safefs.guard(store_dir, "restore the version copies"):
        if safefs.check_dir(vdir):
            for v in vdir.iterdir():
                got = mf.VERSION_FILE_RE.fullmatch(v.name)
                if got and int(got.group(1)) > m["version"]:
                    v.unlink()     # written just before a commit that never happened: not a snapshot
        restore_version_copy(store_dir, m)
    return m


def restore_version_copy(store_dir: Path, m: dict) -> None:
    """Write the current version's copy under versions/ if it is missing or damaged (a crash, a power loss):
    a good copy holds the bytes of manifest.json."""
    vdir = safefs.make_dir(store_dir / mf.VERSIONS_DIR)
    path = vdir / mf.version_file_name(m["version"])
    raw = safefs.read_entry(store_dir / mf.MANIFEST)
    try:
        if safefs.read_entry(path) == raw:
            return
    except (StoreError, OSError):
        pass
    if path.is_symlink() or path.exists():
        path.unlink()
    safefs.write_atomic(path, raw, durable=False)


def bar_extent(present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last calendar index with a bar per symbol (-1 when none), from a [n_sym, n_dates] mask."""
    n = present.shape[1]
    has = present.any(axis=1)
    first = np.where(has, present.argmax(axis=1), -1)
    last = np.where(has, n - 1 - present[:, ::-1].argmax(axis=1), -1)
    return first.astype(np.int64), last.astype(np.int64)


def write_panel(gen, panel: np.ndarray, block_rows: int = 256) -> None:
    """Write ``panel`` [rows, n_dates, n_fields] into a new generation (or a transaction), a block at a time."""
    for lo in range(0, panel.shape[0], block_rows):
        gen.write(lo, panel[lo: lo + block_rows])


def create_store(path: str | os.PathLike, panel: np.ndarray, symbols: Sequence[str], dates: np.ndarray,
                 fields: Sequence[str], *, sources: Iterable[dict] = (), extra: dict | None = None,
                 capacity: int | None = None, wait: float = 0.0, freq: str = timeaxis.DAILY) -> Path:
    """Write a whole store from an in-memory panel [n_sym, n_dates, n_fields] (tests, small data, Python users).

    ``dates`` are the calendar: days for a daily store, bar stamps for an intraday one (``freq`` like "1min").
    An existing store at ``path`` is replaced atomically (new generation, manifest swap); gc removes its old
    data file once no reader uses it. Crash points: ``create:filled``, ``create:data-in-place``, ``commit:*``.
    """
    store_dir = Path(path)
    panel = np.asarray(panel, dtype=np.float32)
    freq = timeaxis.parse_freq(freq)
    dates = np.asarray(dates).astype(f"datetime64[{timeaxis.unit(freq)}]")
    extra = {"freq": freq, **(extra or {}), mf.STORE_ID_KEY: mf.new_store_id()}   # a whole new store
    if panel.shape != (len(symbols), len(dates), len(fields)):
        raise InputError(f"panel shape {panel.shape} does not match {len(symbols)} symbols x {len(dates)} dates"
                         f" x {len(fields)} fields")
    with lock.WriterLock(store_dir, wait=wait, create=True) as held:
        first = not (store_dir / mf.MANIFEST).exists() and not (store_dir / mf.MANIFEST).is_symlink()
        prepare(store_dir)
        try:
            with NewVersion(store_dir, *panel.shape, capacity or default_capacity(len(dates)),
                            crash="create") as txn:
                write_panel(txn, panel)
                present = np.isfinite(panel).any(axis=2) if panel.size else np.zeros(panel.shape[:2], bool)
                first_bar, last_bar = bar_extent(present)
                m = txn.commit(symbols=symbols, dates=dates, fields=fields, first_bar=first_bar, last_bar=last_bar,
                               n_bars=int(present.sum()), sources=sources, extra=extra)
        except BaseException:
            if first:
                _forget_first(store_dir, held)
            raise
        finally:
            clean_staging(store_dir)
        collect(store_dir, m)
    return store_dir


@contextlib.contextmanager
def whole_store(out: Path, *, wait: float = 0.0, replace: bool = False, instead: str = "") -> Iterator[Path]:
    """Write a whole store at ``out`` under the writer lock (ingest, features, processing).

    Refuses an existing store without ``replace`` (``instead`` says what to do), and a folder that holds
    anything but a store or our leftovers; prepares it (a killed writer's staging cleaned). On failure, removes
    what the write left (a first write: everything, the lock file and the folders it made); on success, the
    staging folder. The body writes, commits and collects.
    """
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory")
    with lock.WriterLock(out, wait=wait, create=True) as held:
        has_store = (out / mf.MANIFEST).exists() or (out / mf.MANIFEST).is_symlink()
        if has_store and not replace:
            raise InputError(f"{out}: a store is already there; {instead or 'pass replace=True to rewrite it'}")
        if not has_store and not only_leftovers(out):
            if held.made_file:
                held.remove()   # a folder that is not ours keeps nothing of this refusal
            raise InputError(f"{out}: folder is not empty and holds no store; refusing to overwrite it")
        try:
            prepare(out)
            yield out
        except BaseException:
            clean_failed_write(out, held, first=not has_store)
            raise
        clean_staging(out)


def only_leftovers(folder: Path) -> bool:
    """True when a folder holds nothing but what a killed or failed first ingest of ours can leave."""
    for p in folder.iterdir():
        n = p.name
        if n == mf.VERSIONS_DIR and p.is_dir() and any(p.glob("v*.json")):
            return False   # version copies: a store that lost its manifest.json, recoverable, not leftovers
        if not (n in (lock.LOCK_NAME, STAGING, mf.VERSIONS_DIR) or n.startswith(f".{mf.MANIFEST}.tmp-")
                or mf.DATA_FILE_RE.fullmatch(n)):
            return False
    return True


def clean_failed_write(out: Path, held: lock.WriterLock, first: bool) -> None:
    """Undo a failed write of a whole store (ingest, features; under the lock). Over an existing store: remove staging and a data file no
    manifest uses. A first ingest: remove everything it wrote, the lock file, and the folder if it made it."""
    try:
        clean_staging(out)
        if not first or (out / mf.MANIFEST).exists():
            return
        for p in out.iterdir():
            if p.name == lock.LOCK_NAME:
                continue
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        held.remove()
        if held.created and held.created_from is not None:
            folder = out
            while True:            # the folder, and the parents made for it, if they are empty
                folder.rmdir()
                if folder == held.created_from:
                    break
                folder = folder.parent
    except (OSError, StoreError):
        pass    # the error being raised says what went wrong; leftovers are ours and the next writer's


def _forget_first(store_dir: Path, held: lock.WriterLock) -> None:
    """After a failed first write of a store (a resample, create_store): remove the lock file it made and the
    folders it created when they hold nothing else, so no empty store folder with a ``.lock`` is left."""
    try:
        clean_staging(store_dir)
        vdir = store_dir / mf.VERSIONS_DIR
        if vdir.is_dir() and not vdir.is_symlink() and not any(vdir.iterdir()):
            vdir.rmdir()
        if held.made_file:
            held.remove()
        folder = store_dir
        while held.created and held.created_from is not None:
            folder.rmdir()              # only an empty folder goes
            if folder == held.created_from:
                break
            folder = folder.parent
    except OSError:
        pass        # the error being raised says what went wrong; what is left is harmless to the next writer


def gc(path: str | os.PathLike) -> list[str]:
    """Delete data files and version manifests that the current version does not use and no reader pins.

    Returns the names removed. Safe to run at any time; it takes the writer lock (and gives up if busy).

    Raises:
        StoreError: ``path`` is not a store, or cannot be written (a read-only file system, a planted link).
    """
    store_dir = Path(path)
    mf.read_manifest(store_dir)   # a clear error for a path that is not a store (and no lock file left there)
    try:
        with lock.WriterLock(store_dir, wait=0):
            m = prepare(store_dir)
            if m is None:
                mf.read_manifest(store_dir)    # damaged meanwhile: say why
            return remove_unused(store_dir, m)
    except StoreLockedError:
        return []


def remove_unused(store_dir: Path, m: dict) -> list[str]:
    """gc's work, under the writer lock: remove data files and version copies that ``m`` (the current
    manifest) does not use and no reader pins. Returns the names removed."""
    removed: list[str] = []
    keep = m["data"]["file"]
    with safefs.guard(store_dir, "remove unused files"):
        for f in sorted(store_dir.iterdir()):
            if mf.DATA_FILE_RE.fullmatch(f.name) and f.name != keep and _removable(f):
                f.unlink()
                removed.append(f.name)
        # Old version manifests: open snapshots pin theirs (workers reopen from it); the rest go.
        vdir = store_dir / mf.VERSIONS_DIR
        current = mf.version_file_name(m["version"])
        for v in sorted(vdir.iterdir()) if safefs.check_dir(vdir) else []:
            if mf.VERSION_FILE_RE.fullmatch(v.name) and v.name != current and _removable(v):
                v.unlink()
                removed.append(f"{mf.VERSIONS_DIR}/{v.name}")
    return removed


def _removable(p: Path) -> bool:
    """A symlink planted under a store name is removed as an entry; a file only when no reader pins it."""
    return p.is_symlink() or (p.is_file() and lock.unused(p))


def collect(store_dir: Path, m: dict) -> None:
    """gc right after a commit, still under the lock, best effort: the write is committed whatever happens
    here (a busy disk, a file that vanished)."""
    try:
        remove_unused(store_dir, m)
    except (StoreError, OSError):
        pass
