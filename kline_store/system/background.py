"""Background threads of the training half, stopped before the interpreter finalises.

The loader runs torch kernels (gathers, the next epoch's shuffle) and page read-ahead in daemon threads. A daemon
thread that takes the GIL back after finalisation has begun is ended with pthread_exit, whose unwinding through
torch's C++ frames aborts the whole process ("terminate called without an active exception", exit status 134):
a training script that simply ends while such a thread runs would crash at its last line. So every such thread
is known here, and an exit hook (which runs before finalisation) tells them to stop, closes their owners and
joins them. A thread outlives its owner when the owner is garbage-collected first (a DataLoader rebuilt each
epoch by Lightning): threads are therefore tracked themselves, not only through their owners.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Any

stopping = threading.Event()   # set at exit: long loops in background threads stop between steps
_owners: weakref.WeakSet = weakref.WeakSet()
_threads: weakref.WeakSet = weakref.WeakSet()   # a running thread is kept alive by threading itself
JOIN_TIMEOUT = 60.0            # seconds for all of them at exit: a shuffle of a billion windows still finishes


def stop_before_exit(owner: Any) -> None:
    """Have ``owner.close()`` called at interpreter exit (before finalisation) if ``owner`` is alive then."""
    _owners.add(owner)


def track(thread: threading.Thread) -> threading.Thread:
    """Join ``thread`` at interpreter exit (before finalisation) if it still runs then; returns it."""
    _threads.add(thread)
    return thread


@atexit.register
def _stop_all() -> None:
    stopping.set()
    for owner in list(_owners):
        try:
            owner.close()
        except Exception:   # exiting anyway: one failure must not keep the others running
            pass
    deadline = time.monotonic() + JOIN_TIMEOUT
    for thread in list(_threads):
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
