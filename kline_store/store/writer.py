"""The write side of a store: generations, staging, manifests, commits and gc. Hold the writer lock.

A new generation is a sparse file created in ``.staging``: the bytes a version will see (each row's first
``n_dates`` days) are reserved with ``posix_fallocate`` before anything is written, then rows are written
with ``pwrite``, never through a mapping. So a full disk is one StoreError at the start (naming the store and
the bytes needed), never a SIGBUS, and the reserved room after each row's last day stays a hole. Writers
clean up staging on every failure path, restore the current version's copy under ``versions/`` and remove
copies of versions that were never committed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from . import identity, lock, manifest as mf, safefs, timeaxis as TA
from ..errors import InputError, StoreError, StoreLockedError
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


def build_manifest(*, version: int, data: dict, symbols: Sequence[str], dates: np.ndarray, fields: Sequence[str],
                   capacity: int, first_bar: np.ndarray, last_bar: np.ndarray, n_bars: int,
                   sources: Iterable[dict] = (), created_at: str | None = None, extra: dict | None = None) -> dict:
    freq = (extra or {}).get("freq", TA.DAILY)
    dates_iso = TA.iso(np.asarray(dates).astype(f"datetime64[{TA.unit(freq)}]"))
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


def bar_extent(present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last calendar index with a bar per symbol (-1 when none), from a [n_sym, n_dates] mask."""
    n = present.shape[1]
    has = present.any(axis=1)
    first = np.where(has, present.argmax(axis=1), -1)
    last = np.where(has, n - 1 - present[:, ::-1].argmax(axis=1), -1)
    return first.astype(np.int64), last.astype(np.int64)


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


def write_panel(store_dir: Path, generation: int, panel: np.ndarray, capacity: int | None = None,
                block_rows: int = 256) -> dict:
    """A new generation file holding ``panel`` [rows, n_dates, n_fields]; returns the manifest's ``data``."""
    rows, n_dates, nf = panel.shape
    gen = NewGeneration(store_dir, generation, rows, n_dates, nf, capacity)
    try:
        for lo in range(0, rows, block_rows):
            gen.write(lo, panel[lo: lo + block_rows])
        return gen.finish()
    except BaseException:
        gen.abort()
        raise


def create_store(path: str | os.PathLike, panel: np.ndarray, symbols: Sequence[str], dates: np.ndarray,
                 fields: Sequence[str], *, sources: Iterable[dict] = (), extra: dict | None = None,
                 capacity: int | None = None, wait: float = 0.0, freq: str = TA.DAILY) -> Path:
    """Write a whole store from an in-memory panel [n_sym, n_dates, n_fields] (tests, small data, Python users).

    ``dates`` are the calendar: days for a daily store, bar stamps for an intraday one (``freq`` like "1min").
    An existing store at ``path`` is replaced atomically (new generation, manifest swap); gc removes its old
    data file once no reader uses it.
    """
    store_dir = Path(path)
    panel = np.asarray(panel, dtype=np.float32)
    freq = TA.parse_freq(freq)
    dates = np.asarray(dates).astype(f"datetime64[{TA.unit(freq)}]")
    extra = {"freq": freq, **(extra or {}), mf.STORE_ID_KEY: mf.new_store_id()}   # a whole new store
    if panel.shape != (len(symbols), len(dates), len(fields)):
        raise InputError(f"panel shape {panel.shape} does not match {len(symbols)} symbols x {len(dates)} dates"
                         f" x {len(fields)} fields")
    with lock.WriterLock(store_dir, wait=wait, create=True) as held:
        first = not (store_dir / mf.MANIFEST).exists() and not (store_dir / mf.MANIFEST).is_symlink()
        prepare(store_dir)
        version, generation, _ = next_numbers(store_dir)
        data = None
        cap = capacity or default_capacity(len(dates))
        try:
            data = write_panel(store_dir, generation + 1, panel, cap)
            present = np.isfinite(panel).any(axis=2) if panel.size else np.zeros(panel.shape[:2], bool)
            first, last = bar_extent(present)
            m = build_manifest(version=version + 1, data=data, symbols=symbols, dates=dates, fields=fields,
                               capacity=cap, first_bar=first, last_bar=last, n_bars=int(present.sum()),
                               sources=sources, extra=extra)
            commit(store_dir, m)
        except BaseException:
            discard_uncommitted(store_dir, data and data["file"])
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


def tail_ranges(stride: int, cell: int, n_old_rows: int, n_rows: int, n_old: int, n_new: int) -> list[tuple[int, int]]:
    """Byte ranges a tail append writes: the new days of the old rows, then whole new rows."""
    ranges = [(r * stride + n_old * cell, (n_new - n_old) * cell) for r in range(n_old_rows)] if n_new > n_old else []
    return ranges + [(r * stride, n_new * cell) for r in range(n_old_rows, n_rows)]


@contextlib.contextmanager
def tail_append(store_dir: Path, path: Path, size: int, ranges: list[tuple[int, int]], pinned: int | None = None,
                crash: str = "tail") -> Iterator[int]:
    """The data file open for writing where no committed version looks (hold the lock): grown to ``size`` bytes
    (sparse), ``ranges`` reserved; the body pwrites; then fsync, so the data is durable before the manifest that
    shows it. On failure the file is cut back to its size (no version sees beyond it) and an OS error is one
    line. ``pinned``: a descriptor of the file the caller read, which must still be this one."""
    need = sum(length for _, length in ranges)
    with safefs.guard(store_dir, f"append to {path.name}", need):
        fd = safefs.open_entry(path, os.O_RDWR)
    try:
        if pinned is not None and \
                (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (os.fstat(pinned).st_dev, os.fstat(pinned).st_ino):
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
