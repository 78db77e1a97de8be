"""gc off the writer's critical path: the files a commit left unused, removed by a background thread.

Unlinking a replaced data file of a few hundred MB frees its blocks synchronously (0.5 s on the real-panel
features store, as long as computing it); the commit does not need to wait for that. Crash-safe as before: the
list is taken under the writer lock, after the commit; a file that outlives a crash is one no manifest names,
which the next write's gc removes; a file some reader pinned meanwhile is left for that gc too. The thread is
not a daemon: the interpreter finishes the removals before it exits.
"""

from __future__ import annotations

import threading
from pathlib import Path

from . import lock, manifest as mf, safefs
from ..errors import StoreError

_pending: list[threading.Thread] = []


def unused_files(store_dir: Path, m: dict) -> list[Path]:
    """Data files and version copies that ``m`` (the current manifest) does not use: what gc removes."""
    keep, current = m["data"]["file"], mf.version_file_name(m["version"])
    out = [f for f in sorted(store_dir.iterdir()) if mf.DATA_FILE_RE.fullmatch(f.name) and f.name != keep]
    vdir = store_dir / mf.VERSIONS_DIR
    if safefs.check_dir(vdir):
        out += [v for v in sorted(vdir.iterdir()) if mf.VERSION_FILE_RE.fullmatch(v.name) and v.name != current]
    return out


def _remove(paths: list[Path]) -> None:
    for p in paths:
        try:
            if p.is_symlink() or (p.is_file() and lock.unused(p)):
                p.unlink(missing_ok=True)
        except (OSError, StoreError):
            pass  # best effort: the next gc sees it again


def collect_in_background(store_dir: Path, m: dict) -> None:
    """Call right after a commit, under the writer lock: list what gc would remove, remove it in a thread."""
    try:
        with safefs.guard(store_dir, "remove unused files"):
            paths = unused_files(store_dir, m)
    except (StoreError, OSError):
        return
    if paths:
        thread = threading.Thread(target=_remove, args=(paths,), name="kline-store-gc")
        _pending[:] = [t for t in _pending if t.is_alive()] + [thread]
        thread.start()


def wait() -> None:
    """Until every background removal started so far has finished."""
    for thread in list(_pending):
        thread.join()
