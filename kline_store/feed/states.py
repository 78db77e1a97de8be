"""A loader state is untrusted input: it comes back from a checkpoint file that anyone may have edited, truncated or
written by hand. Every key a state of ours holds is checked for its type and range before any of it is used, and a
bad one is one line naming the key and its value (an InputError, never a ValueError from ``int('x')`` deep inside).

Keys no state of ours holds are left alone (a newer version's state may carry more); the order's own checks then
compare the values with the loader's (``sampling.EpochBatches``, ``block_feed.BlockBatches``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InputError

_MAX = 1 << 62   # no count of ours comes near this; bigger is a damaged number

# key -> (smallest whole value, what it is)
WHOLE = {"epoch": (0, "an epoch"), "position": (0, "a sample position"), "n": (0, "a sample count"),
         "rank": (0, "a rank"), "world_size": (1, "a number of ranks"), "batch_size": (1, "a batch size"),
         "pool": (1, "a number of blocks"), "lifetime": (1, "a number of rounds"),
         "n_blocks": (0, "a number of blocks"), "block_bytes": (0, "a number of bytes"),
         "version": (1, "a store version")}
FLAGS = ("shuffle", "drop_last")
WORDS = ("tail", "order")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(value: Any) -> int | None:
    """An integer from a whole number (an int, or a float without a fraction: JSON writers may give 3.0); None for
    anything else (a string, a bool, NaN, infinity, a list)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def check_state(state: Any) -> dict[str, Any]:
    """A copy of a loader state with every known key checked (whole numbers as ints); one-line InputError naming the
    first bad key and its value."""
    if not isinstance(state, dict):
        raise InputError(f"loader state is a {type(state).__name__}; expected a dict from state_dict()")
    out = dict(state)
    for key, (least, what) in WHOLE.items():
        if key not in state or (key in ("version", "block_bytes") and state[key] is None):
            continue
        v = _whole(state[key])
        if v is None or not least <= v <= _MAX:
            raise InputError(f"loader state has {key}={_short(state[key])}; expected {what}, a whole number >= "
                             f"{least}, from state_dict()")
        out[key] = v
    seed = state.get("seed", 0)
    if _whole(seed) is None or abs(_whole(seed)) > 1 << 63:   # type: ignore[arg-type]
        raise InputError(f"loader state has seed={_short(seed)}; expected an integer seed from state_dict()")
    if "seed" in state:
        out["seed"] = _whole(seed)
    for key in FLAGS:
        if key in state and not isinstance(state[key], (bool, np.bool_)):
            raise InputError(f"loader state has {key}={_short(state[key])}; expected true or false from "
                             f"state_dict()")
    for key in WORDS:
        if key in state and not isinstance(state[key], str):
            raise InputError(f"loader state has {key}={_short(state[key])}; expected a word from state_dict()")
    return out


__all__ = ["check_state"]
