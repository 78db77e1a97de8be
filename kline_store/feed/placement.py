"""Where the panel lives while batches are gathered: on a GPU, a resident copy when it fits, else a pinned host
copy, else the memmap; on the CPU always the memmap (the page cache holds it once for every process and rank on the
machine; a private copy would multiply it by the number of ranks).

The read-ahead of a store's pages, core counts and thread priority moved to ``kline_store/system/`` (``pages``,
``cores``), where every wing may use them; their old names here stay.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError
from ..memory import mem_available
from ..system.cores import background_priority, usable_cores  # noqa: F401  (their old home)
from ..system.pages import READAHEAD_FRACTION, readahead  # noqa: F401
from ..system.pages import madvise as _madvise  # noqa: F401

PLACEMENTS = ("auto", "device", "pinned", "memmap")
# Fractions of free memory a panel may take: leave the device room for the model and activations.
DEVICE_FRACTION = 0.5
PINNED_FRACTION = 0.25


def choose_placement(nbytes: int, *, cuda: bool, requested: str = "auto", device_free: int | None = None,
                     host_available: int | None = None, device_fraction: float = DEVICE_FRACTION,
                     pinned_fraction: float = PINNED_FRACTION) -> str:
    """Where the panel (the fields and days samples use) should live.

    ``auto`` on CUDA picks ``device`` when the panel fits in ``device_fraction`` of the free device memory, else
    ``pinned`` when it fits in ``pinned_fraction`` of the available host memory, else ``memmap``. Without CUDA,
    ``auto`` is ``memmap``.

    Args:
        nbytes: bytes of the panel to place.
        cuda: whether batches go to a CUDA device.
        requested: "auto", or a placement to force.
        device_free: free device memory in bytes (None: unknown, treated as 0).
        host_available: available host memory in bytes (None: unknown, treated as 0).
        device_fraction: share of free device memory the panel may use.
        pinned_fraction: share of available host memory the pinned panel may use.

    Returns:
        "device", "pinned" or "memmap".

    Raises:
        InputError: unknown placement, or "pinned" without CUDA.
    """
    if requested not in PLACEMENTS:
        raise InputError(f"placement must be one of {', '.join(PLACEMENTS)}; got {requested!r}")
    if requested == "pinned" and not cuda:
        raise InputError("placement='pinned' needs a CUDA device (pinned memory only speeds up copies to a GPU); "
                         "use placement='memmap' or 'device' with device='cpu'")
    if requested != "auto":
        return requested
    if not cuda:
        return "memmap"
    if nbytes <= (device_free or 0) * device_fraction:
        return "device"
    if nbytes <= (host_available or 0) * pinned_fraction:
        return "pinned"
    return "memmap"


def host_available_bytes() -> int:
    """Available host memory (``MemAvailable``), or physical memory when /proc is not there."""
    return mem_available()


def device_free_bytes(device: Any) -> int | None:
    """Free memory of a CUDA device in bytes; None for the CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free)


__all__ = ["PLACEMENTS", "choose_placement", "device_free_bytes", "host_available_bytes"]
