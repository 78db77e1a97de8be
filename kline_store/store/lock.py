"""Writer lock and reader pins, both on flock(2).

Writers take an exclusive lock on ``STORE/.lock`` and write who they are into it, so a second writer can say
"store is locked by pid 123 on host (kline-store append) since ...". Readers hold a shared lock on the data
file they map; gc deletes an old data file only if it can take an exclusive lock on it without waiting.

The lock file is opened without following a symlink and must be a regular file with one link, so a planted
``.lock`` cannot make a writer truncate a file outside the store. A writer that removes the lock file (a
failed first ingest removes the folder it created) leaves waiters holding a lock on a deleted file: each
waiter checks, once it has the lock, that the file is still the one at ``STORE/.lock``, and starts over if not.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from . import safefs
from ..errors import StoreError, StoreLockedError
from .manifest import now_iso

LOCK_NAME = ".lock"


class WriterLock:
    """Exclusive writer lock of a store directory; a context manager.

    Args:
        store_dir: the store directory.
        wait: seconds to wait for a busy lock; 0 fails at once.
        create: create the directory if it is missing (a first ingest); ``created`` then says whether this
            lock made it. Without ``create`` a missing directory is "no such store".
    """

    def __init__(self, store_dir: Path, wait: float = 0.0, create: bool = False) -> None:
        self.store = Path(store_dir)
        self.path = self.store / LOCK_NAME
        self.wait = wait
        self.create = create
        self.created = False
        self.created_from: Path | None = None   # the topmost folder this lock created (parents included)
        self.made_file = False                  # the lock file did not exist before this lock
        self.fd: int | None = None

    def __enter__(self) -> "WriterLock":
        deadline = time.monotonic() + self.wait
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise StoreLockedError(f"{self.store}: store is locked by {holder or 'another writer'}"
                                           " (retry later, or pass --wait SECONDS)") from None
                os.close(fd)
                time.sleep(0.05)
                continue
            if self._still_linked(fd):
                break
            os.close(fd)        # the holder removed the lock file (and maybe the folder): start over
        with safefs.guard(self.store, "take the writer lock"):
            os.ftruncate(fd, 0)
            argv = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv[:3]))
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} ({argv}) since {now_iso()}".encode(), 0)
        self.fd = fd
        return self

    def _open(self) -> int:
        if self.create and not self.store.is_dir():
            top = self.store
            while not top.parent.exists() and top.parent != top:
                top = top.parent
            try:
                os.makedirs(self.store)
                self.created, self.created_from = True, top
            except FileExistsError:
                pass
            except OSError as exc:
                raise safefs.os_error(exc, self.store, "create the store folder") from None
        existed = os.path.lexists(self.path)
        try:
            fd = safefs.open_entry(self.path, os.O_RDWR | os.O_CREAT)
            self.made_file = not existed
        except FileNotFoundError:
            if self.create:
                return self._open()      # the folder vanished in between (a failed first ingest): again
            raise StoreError(f"{self.store}: no such store") from None
        except OSError as exc:
            raise safefs.os_error(exc, self.store, "take the writer lock") from None
        if os.fstat(fd).st_nlink != 1:
            os.close(fd)
            raise StoreError(f"{self.path}: has other links; a store's files must be its own")
        return fd

    def _still_linked(self, fd: int) -> bool:
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def remove(self) -> None:
        """Unlink the lock file while holding it (waiters notice and start over)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass       # a read-only or full file system: the lock is released all the same
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def pin_shared(fd: int) -> None:
    """Mark a data file as in use by this process (and its forked children)."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def unused(path: Path) -> bool:
    """True when no process pins ``path``: an exclusive lock can be taken at once."""
    try:
        fd = safefs.open_entry(path)
    except FileNotFoundError:
        return True
    except (OSError, StoreError):
        return False       # not a plain file of ours: leave it alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    finally:
        os.close(fd)
