"""The ranks' agreement on a value: every rank of the default process group takes the one the first rank to ask
gave (the store version a dataset reads, the size of the block order's blocks), so that ranks that measured or
opened things at different moments still cut their shares the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_ASKED: dict[str, int] = {}   # first_rank_decides calls per key in this process: the k-th agrees with the k-th


def first_rank_decides(key: str, value: int) -> int | None:
    """The value every rank of the default process group takes for the k-th question ``key`` asked in this
    process: the first rank to ask decides (a compare-and-set in the group's key-value store, so a rank that asks
    alone never waits). None outside torch.distributed, with one rank, or without a store (nothing to agree on)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    try:
        kv = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError):   # an older torch, or a group without a store: no agreement
        return None
    _ASKED[key] = _ASKED.get(key, 0) + 1
    return int(kv.compare_set(f"{key}/{_ASKED[key]}", "", str(int(value))))


def agreed_version(store: Any, version: int) -> int | None:
    """The store version every rank of the default process group reads (:func:`first_rank_decides`); None
    outside torch.distributed or with one rank (nothing to agree on yet)."""
    m = store.manifest   # what stays the same across a store's versions, and tells stores apart on any node
    first = (m.get("calendar") or [""])[0], (m.get("symbols") or [""])[0]
    name = f"kline-store/version/{m.get('created_at', '')}/{Path(str(store.path)).name}/{first[0]}/{first[1]}"
    return first_rank_decides(name, version)


__all__ = ["agreed_version", "first_rank_decides"]
