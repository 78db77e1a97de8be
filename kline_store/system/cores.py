"""Cores: how many this process may run on, how many ranks share the machine, and the priority of work done ahead
of need."""

from __future__ import annotations

import os
import threading


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_world_size() -> int:
    """Ranks sharing this machine (torchrun sets LOCAL_WORLD_SIZE), 1 otherwise."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def background_priority() -> None:
    """Give the calling thread the lowest CPU priority (Linux: a thread is scheduled on its own; elsewhere a no-op).

    For work done ahead of need (the next epoch's order): it should take only cores nobody else wants.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


__all__ = ["background_priority", "local_world_size", "usable_cores"]
