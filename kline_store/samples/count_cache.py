"""The per-user cache of block counts (``samples/blocks.py``'s segment counts, ``day_blocks.py``'s day counts).

Counting the valid windows of a store is one pass over it; the counts are kept in ``$KLINE_STORE_CACHE/blocks``
(default ``~/.cache/kline-store/blocks``), keyed by the store's identity and the sample plan, so that another
process, rank or restart loads them instead of counting again.

A cache file is untrusted input, like a store: it is opened without following a link and without waiting on a
FIFO, must be a regular file of this user no bigger than its counts need, and hold exactly the arrays expected
(names, dtypes, shapes, the plan's bounds). Its counts are then checked against the store by the caller
(``BlockIndex.check``, ``DayBlocks.check``: the bounds each row's bars allow, the total, a sample of segments
counted again); anything wrong is one warning and a recount. Files are written to a temporary name created
exclusively without following links, then renamed over; each user writes only files named with their own uid,
so a shared ``KLINE_STORE_CACHE`` never lets one user replace another's.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import stat
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .spec import SamplePlan

_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC   # never through a link, never blocked by a FIFO
_NPZ_OVERHEAD = 64 << 10                               # zip headers and array headers of a few arrays
SAMPLE_SEED_BYTES = 8                                  # of os.urandom: which segments a check counts again


def cache_dir() -> Path:
    """Where segment counts are kept between processes: ``$KLINE_STORE_CACHE`` or ``~/.cache/kline-store``."""
    return Path(os.environ.get("KLINE_STORE_CACHE") or Path.home() / ".cache" / "kline-store") / "blocks"


def cache_key(store: Any, plan: SamplePlan, *extra: Any) -> str:
    """The cache file name of counts over ``store`` (path, version, checksums) for ``plan`` and ``extra``."""
    m = store.manifest
    ident = [str(Path(store.path).resolve()), store.version, m.get("manifest_checksum"), m["data"].get("file"),
             m["data"].get("checksum"), repr(plan), *extra]
    return hashlib.sha256(json.dumps(ident, default=str).encode()).hexdigest()[:32]


def cache_file(key: str) -> Path:
    """This user's cache file of ``key`` (the uid in the name: users sharing a cache folder never share a file)."""
    return cache_dir() / f"{key}.u{os.geteuid()}.npz"


def temp_path(path: Path) -> Path:
    """The temporary name ``path`` is written under before the rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


T = TypeVar("T")


def cached(path: Path, load: Callable[[Path], T | None], build: Callable[[], T],
           save: Callable[[Path, T], None], fresh: bool = False) -> T:
    """``load(path)``, else ``build()`` and ``save`` it, holding a lock beside ``path`` while building: the ranks
    of a node started together build once and the others load its result. ``fresh``: build without loading (the
    loaded counts disagreed with another rank's). No cache is no error."""
    got = None if fresh else load(path)
    if got is not None:
        return got
    lock = None
    try:
        if _folder_ok(path.parent):
            lock = _open_regular(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT)
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
            got = None if fresh else load(path)
    except OSError:
        pass
    try:
        if got is None:
            got = build()
            if lock is not None:    # a folder that is a link, or a lock that is not a file: nothing is written
                save(path, got)
    finally:
        if lock is not None:
            os.close(lock)
    return got


def _folder_ok(folder: Path) -> bool:
    """Create the cache folder; False (no cache) when it is a link or not a folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return stat.S_ISDIR(os.lstat(folder).st_mode)
    except OSError:
        return False


def _open_regular(path: Path, flags: int) -> int | None:
    """A descriptor of the regular file ``path`` (created if ``flags`` say so), else None: a link, a FIFO, a
    device, a folder. Raises OSError for the caller (a missing file)."""
    fd = os.open(path, flags | _OPEN, 0o644)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_arrays(path: Path, expect: Mapping[str, tuple[np.dtype, tuple[int, ...]]]
                ) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """The arrays of a cache file, each of the dtype and shape ``expect`` names, and nothing else.

    Returns:
        ``(arrays, None)``; ``(None, None)`` when there is no file; ``(None, what is wrong)`` for a file that is not
        such a cache: a link, not a regular file, another user's, too big, not an ``.npz``, other arrays.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, "a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_uid != os.geteuid():
            return None, f"owned by uid {st.st_uid}, not this user"
        limit = _NPZ_OVERHEAD + sum(np.dtype(d).itemsize * int(np.prod(s, dtype=np.int64)) for d, s in expect.values())
        if st.st_size > limit:
            return None, f"{st.st_size:,} bytes, more than the {limit:,} its counts take"
        data = _read_upto(fd, limit)
        if len(data) > limit:
            return None, f"more than the {limit:,} bytes its counts take"
    except OSError as exc:
        return None, exc.strerror or str(exc)
    finally:
        os.close(fd)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            if sorted(z.files) != sorted(expect):
                return None, f"arrays {sorted(z.files)[:8]}, expected {sorted(expect)}"
            arrays = {name: z[name] for name in expect}
    except (OSError, ValueError, EOFError, KeyError) as exc:   # not a zip, a damaged one, a pickled object
        return None, f"not an .npz of counts ({' '.join(str(exc).split())[:80]})"
    except Exception as exc:                                  # zipfile's own errors (BadZipFile, ...)
        return None, f"not an .npz of counts ({type(exc).__name__})"
    for name, (dtype, shape) in expect.items():
        a = arrays[name]
        if a.dtype != np.dtype(dtype) or a.shape != tuple(shape):
            return None, f"{name!r} is {a.dtype} {a.shape}, expected {np.dtype(dtype)} {tuple(shape)}"
    return arrays, None


def _read_upto(fd: int, limit: int) -> bytes:
    parts, got = [], 0
    while got <= limit:
        b = os.read(fd, limit + 1 - got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


_WARNED: set[str] = set()   # files warned about since this process last wrote them


def ignore(path: Path, problem: str) -> None:
    """One warning (once per file until it is written again): the cache file is not used, the counts are counted
    again."""
    if str(path) in _WARNED:
        return
    _WARNED.add(str(path))
    warnings.warn(f"kline-store: ignoring the block counts cached in {path} ({problem}); counting them again from "
                  f"the store", RuntimeWarning, stacklevel=4)


def save_arrays(path: Path, **arrays: Any) -> None:
    """An ``.npz`` written atomically: a temporary file created exclusively, never through a link (a link planted
    at its name is removed, not followed), renamed over ``path``. A cache that cannot be written is no error."""
    tmp = temp_path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileExistsError:        # a killed writer of our pid, or something planted: the entry goes
            os.unlink(tmp)
            fd = os.open(tmp, flags, 0o644)
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
        _WARNED.discard(str(path))
    except OSError:
        try:
            if stat.S_ISREG(os.lstat(tmp).st_mode) and os.lstat(tmp).st_uid == os.geteuid():
                tmp.unlink()
        except OSError:
            pass


def forget(path: Path | None) -> None:
    """Remove this user's cache file (counts found wrong while in use)."""
    if path is None:
        return
    try:
        if os.lstat(path).st_uid == os.geteuid():
            path.unlink()
    except OSError:
        pass


def window_days(store: Any, plan: SamplePlan, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` per symbol row: the window end days its bars allow (empty when ``lo > hi``). A window's label
    day has a bar (``t + horizon <= last_bar``), and its last day too when the plan has input fields."""
    first = np.asarray(store.first_bar, dtype=np.int64)
    last = np.asarray(store.last_bar, dtype=np.int64)
    if rows is not None:
        first, last = first[rows], last[rows]
    lo = np.where(first >= 0, first if plan.x_fields else 0, np.iinfo(np.int64).max // 2)
    hi = np.where(last >= 0, last - plan.horizon, -1)
    return lo, hi


def overlap(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Days of ``[lo, hi]`` (per row, a column) inside each ``[a, b)`` (per segment, a row of the result)."""
    return np.maximum(0, np.minimum(hi[:, None] + 1, b[None, :]) - np.maximum(lo[:, None], a[None, :]))


def sample_rng() -> np.random.Generator:
    """Which segments a check counts again: drawn anew by every process (no one can place counts where no check
    ever looks)."""
    return np.random.default_rng(int.from_bytes(os.urandom(SAMPLE_SEED_BYTES), "little"))


__all__ = ["cache_dir", "cache_file", "cache_key", "cached", "forget", "ignore", "overlap", "read_arrays",
           "sample_rng", "save_arrays", "temp_path", "window_days"]
