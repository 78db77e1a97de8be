"""File-system guards for a store's own files.

A store touches nothing but itself: its entries are opened by plain name without following a symbolic link,
sub-folders are checked to be real folders, new files are created exclusively, and bytes are reserved
(``posix_fallocate``) before they are written, so a full disk is an error at the start of a write, never a
signal in the middle of one. Every OS error of a writer becomes one :class:`StoreError` line that names the
store, what was being done and, for a full disk, the bytes needed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import InputError, StoreError

# Flags of every open of a store entry: never through a symlink; never block on a FIFO someone put there.
_SAFE = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def plain_name(name: object) -> bool:
    """True for a file name that stays inside its folder: no separator, not ``.``/``..``, not empty."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name
            and "\\" not in name)


def open_entry(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """Open a store entry without following a symlink; only regular files are accepted.

    Raises:
        StoreError: the entry is a symbolic link or not a regular file.
        OSError: anything else (missing file, permissions, ...), for the caller to put in context.
    """
    try:
        fd = os.open(path, flags | _SAFE, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise StoreError(f"{path}: is a symbolic link; a store's files must be inside it") from None
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise StoreError(f"{path}: not a regular file")
    return fd


def read_entry(path: Path) -> bytes:
    """The bytes of a store entry (a manifest), read without following a symlink."""
    fd = open_entry(path)
    try:
        parts = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(parts)
            parts.append(b)
    finally:
        os.close(fd)


def read_small(path: Path, limit: int) -> bytes:
    """The bytes of a small file we did not write (a tuning file): a regular file, no link, no FIFO, at most
    ``limit`` bytes, else StoreError; OSError (a missing file) for the caller."""
    fd = open_entry(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise StoreError(f"{path}: {size} bytes, more than the {limit} such a file may have")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise StoreError(f"{path}: more than the {limit} bytes such a file may have")
        return data
    finally:
        os.close(fd)


def check_dir(path: Path) -> bool:
    """True when ``path`` is a real folder, False when it does not exist.

    Raises:
        StoreError: it is a symbolic link or not a folder.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{path}: is a symbolic link; a store's files must be inside it")
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{path}: not a folder")
    return True


def make_dir(path: Path) -> Path:
    """Create a store sub-folder if missing; refuse one that is a symlink or a file."""
    if not check_dir(path):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        check_dir(path)
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """pwrite until every byte is written (a short write is legal, if rare)."""
    view = memoryview(data).cast("B")
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` so a reader sees the old or the new bytes, never a torn file.

    The temporary file is created exclusively and without following links, so a symlink planted under its
    name cannot redirect the write; the rename replaces an entry, never the target of a link. ``durable``
    also fsyncs the file and its folder.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644)
    except FileExistsError:            # left by a killed process that had our pid: ours to remove
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o644)
    try:
        try:
            write_all(fd, data, 0)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) ranges, sorted, with touching ones joined; empty ones dropped."""
    out: list[list[int]] = []
    for off, length in sorted(r for r in ranges if r[1] > 0):
        if out and off <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], off + length - out[-1][0])
        else:
            out.append([off, length])
    return [(o, n) for o, n in out]


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: object = False   # looked up once: libc's function, or None where there is none


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing a range's dirty pages to disk now, without waiting and keeping them cached (Linux
    sync_file_range), so an fsync later has little left to wait for and dirty pages do not pile up under a
    memory limit. Only a hint: a no-op where the call is missing or fails."""
    global _sync_file_range
    if _sync_file_range is False:
        try:
            import ctypes
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            _sync_file_range = fn
        except (OSError, AttributeError):
            _sync_file_range = None
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)   # type: ignore[operator]


def reserve(fd: int, ranges: Iterable[tuple[int, int]]) -> None:
    """Allocate disk blocks for the byte ranges about to be written (the rest of the file stays sparse).

    A full disk fails here, before any byte is written. A file system without fallocate (some network or
    FUSE ones) reserves nothing; writes there still fail cleanly, as pwrite errors.
    """
    for off, length in merge_ranges(ranges):
        try:
            os.posix_fallocate(fd, off, length)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                return
            raise


def free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def os_error(exc: OSError, store: Path, doing: str, need: int | None = None) -> StoreError:
    """One line for an OS error of a writer: the store, what it was doing, and what to do about it."""
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(store)
        room = f"; {free:,} bytes free" if free is not None else ""
        needs = f" needs {need:,} bytes" if need else ""
        what = "no space left on device" if code == errno.ENOSPC else "disk quota exceeded"
        return StoreError(f"{store}: {what}: {doing}{needs}{room}; nothing was changed")
    if code == errno.EROFS:
        return StoreError(f"{store}: read-only file system: cannot {doing}")
    if code in (errno.EACCES, errno.EPERM):
        return StoreError(f"{store}: permission denied: cannot {doing} ({exc.filename or store})")
    if code == errno.EFBIG:
        needs = f" of {need:,} bytes" if need else ""
        return StoreError(f"{store}: file too large: {doing} needs a file{needs} over this process's file-size "
                          f"limit (ulimit -f)")
    where = f" ({exc.filename})" if exc.filename else ""
    return StoreError(f"{store}: cannot {doing}: {exc.strerror or exc}{where}")


@contextlib.contextmanager
def guard(store: Path, doing: str, need: int | None = None) -> Iterator[None]:
    """Turn an OSError raised inside into a one-line StoreError (see :func:`os_error`)."""
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        raise os_error(exc, store, doing, need) from None


def outside_store(store: str | os.PathLike, out: str | os.PathLike) -> None:
    """InputError when ``out`` is the store, or inside it: an export or a resample never writes over what it
    reads (``export STORE -o STORE/manifest.json`` replaced the manifest)."""
    src, dst = Path(store).resolve(), Path(out).resolve()
    if dst == src or src in dst.parents:
        raise InputError(f"{out}: is inside the store {store} it is made from; write it elsewhere")
