"""Ranks agree on what their datasets hold before the first step.

Each rank builds its dataset alone; its block counts may come from its own node's cache, which may be stale, damaged
or planted. Two ranks whose datasets differ in length run different numbers of steps, and the first collective of
the shorter one's last step waits for ever (a DDP run hangs). So a loader sharded over the default process group
posts a digest of its dataset's samples (``source.sample_digest()``: the count, and a checksum of the block counts)
and reads every rank's: when they differ, every rank counts again from its store (``source.recount()``: cached
counts are not trusted twice) and they compare once more; when they still differ, every rank stops with the same
one-line error naming each rank's count. Nothing is decided by one rank alone, so no rank trains on while another
fails.

This is a rendezvous: every rank of the group makes the loader (a loader sharded over the group is made by all of
them). It goes through the group's key-value store, not a collective, and waits as long as the group's timeout.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from .source import BatchSource

PREFIX = "kline-store/samples"
_SHOWN = 8                       # ranks named in the error line
_ASKED: dict[str, int] = {}     # rendezvous per key in this process: the k-th meets the other ranks' k-th


def group_of(rank: int, world: int) -> Any:
    """The default process group's key-value store when this loader is sharded over that group (``rank`` and
    ``world`` are the group's and it has two ranks or more), else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if world < 2 or world != dist.get_world_size() or rank != dist.get_rank():
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError):   # an older torch, or a group without a store: nothing to agree on
        return None


def every_rank(kv: Any, key: str, value: str, rank: int, world: int) -> list[str]:
    """Every rank's ``value`` for the k-th rendezvous ``key`` of this process (blocks until all have posted)."""
    _ASKED[key] = _ASKED.get(key, 0) + 1
    names = [f"{key}/{_ASKED[key]}/{r}" for r in range(world)]
    try:
        kv.set(names[rank], value)
        kv.wait(names)
        return [bytes(kv.get(n)).decode() for n in names]
    except RuntimeError as exc:   # the group's timeout (DistStoreError is a RuntimeError), or a store gone
        raise InputError(f"rank {rank}: the other ranks did not make their loaders over the dataset "
                         f"({' '.join(str(exc).split())[:120]}); every rank of the group must make the loader") \
            from None


def agree_samples(source: BatchSource, rank: int, world: int) -> None:
    """Make the ranks' datasets agree (see the module docstring); one-line InputError on every rank when they
    cannot."""
    kv = group_of(rank, world)
    if kv is None:
        return
    seen = every_rank(kv, PREFIX, source.sample_digest(), rank, world)
    if len(set(seen)) == 1:
        return
    source.recount()
    seen = every_rank(kv, PREFIX, source.sample_digest(), rank, world)
    if len(set(seen)) == 1:
        return
    shown = ", ".join(f"rank {r}: {d}" for r, d in enumerate(seen[:_SHOWN])) + (", ..." if world > _SHOWN else "")
    raise InputError(f"{source.path}: the ranks' datasets differ after counting again from the store ({shown}): "
                     f"the ranks read different data (another store at this path on some node) or were given other "
                     f"dataset arguments; make the dataset alike on every rank")


__all__ = ["agree_samples", "every_rank", "group_of"]
