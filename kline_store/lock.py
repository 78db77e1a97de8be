"""Writer lock and reader pins, both on flock(2).

Writers take an exclusive lock on ``STORE/.lock`` and write who they are into it, so a second writer can say
"store is locked by pid 123 on host (kline-store append) since ...". Readers hold a shared lock on the data
file they map; gc deletes an old data file only if it can take an exclusive lock on it without waiting.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from .errors import StoreLockedError
from .manifest import now_iso

LOCK_NAME = ".lock"


class WriterLock:
    """Exclusive writer lock of a store directory; a context manager.

    Args:
        store_dir: the store directory (created if missing).
        wait: seconds to wait for a busy lock; 0 fails at once.
    """

    def __init__(self, store_dir: Path, wait: float = 0.0) -> None:
        self.path = Path(store_dir) / LOCK_NAME
        self.wait = wait
        self.fd: int | None = None

    def __enter__(self) -> "WriterLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise StoreLockedError(f"{self.path.parent}: store is locked by {holder or 'another writer'}"
                                           " (retry later, or pass --wait SECONDS)") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        who = f"pid {os.getpid()} on {socket.gethostname()} ({' '.join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv[:3]))}) since {now_iso()}"
        os.pwrite(fd, who.encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
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
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
