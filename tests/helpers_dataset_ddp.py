"""Run under torchrun (gloo): every rank iterates its shard of the loader and writes what it saw.

Usage: python -m torch.distributed.run ... helpers_dataset_ddp.py STORE OUT_DIR END PHASE [STEPS]

PHASE "full": the whole epoch; "head": the first STEPS batches, then the loader state is saved as a checkpoint
would; "tail": a restarted job loads that state and runs the rest of the epoch; "race": END is a file that
rank 0 appends to the store after it opened it and before rank 1 opens it (the ranks then agree on one version).
"bhead" and "btail": the same in the block order, for windows (blocks sized from each rank's memory) and for
cross-sections (blocks of DAYS dates), and "btail" runs epoch 1 after the rest of epoch 0.
"counts": each rank reads its own block-count cache (the test poisons one); "differ": rank 1's dataset ends a day
earlier than rank 0's (the ranks must stop, both, in one line).
Files are keyed by global rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from kline_store import append, open_store
from kline_store.errors import KlineStoreError
from kline_store.samples import blocks as blocks_module
from kline_store.feed.block_feed import agreed_blocks
from kline_store.samples import day_blocks
from kline_store.samples.cross_section import CrossSectionDataset
from kline_store.samples.dataset import KlineDataset

DAYS = 5   # dates per segment of the cross-sections' day blocks


def block_loaders(store: str, end: str) -> dict:
    """The block order over windows (blocks sized from the memory, agreed by the ranks) and over cross-sections
    (a block a segment of DAYS dates), each with a pool of 2 blocks."""
    ds = KlineDataset(store, window=10, horizon=2, end=end, index="blocks")
    day_blocks.SEG_ROW_BYTES = DAYS * 4 * ds.store.n_fields
    xs = CrossSectionDataset(ds)
    return {"win": ds.loader(batch_size=8, seed=3, order="blocks", pool_blocks=2),
            "xs": xs.loader(batch_size=2, seed=3, order="blocks", pool_blocks=2, block_bytes=1)}


def keys(batch: dict) -> list:
    if "mask" in batch:   # a cross-section: its day
        return [int(t) for t in batch["t"]]
    return [[int(s), int(t)] for s, t in zip(batch["symbol"], batch["t"])]


def blocks(out_dir: Path, store: str, end: str, phase: str, steps: int, rank: int) -> None:
    loaders = block_loaders(store, end)
    seen: dict = {k: [[]] for k in loaders}
    for kind, ld in loaders.items():
        if phase == "btail":
            ld.load_state_dict(json.loads((out_dir / f"bstate-{rank}.json").read_text())[kind])
        for epoch in range(1 if phase == "bhead" else 2):
            for i, batch in enumerate(ld):
                n = torch.tensor([len(batch["t"])])
                dist.all_reduce(n)   # a collective per step: uneven step counts would hang here
                seen[kind][-1] += keys(batch)
                if phase == "bhead" and i + 1 == steps:
                    break
            seen[kind].append([])
        seen[kind].pop()
    states = {k: ld.state_dict() for k, ld in loaders.items()}
    if phase == "bhead":
        (out_dir / f"bstate-{rank}.json").write_text(json.dumps(states))
    record = {"rank": rank, "world": dist.get_world_size(), "seen": seen, "state": states,
              "agreed": agreed_blocks("kline-test/blocks", 10 + rank)}   # each rank proposes its own
    (out_dir / f"{phase}-{rank}.json").write_text(json.dumps(record))


def counts(out_dir: Path, store: str, end: str, phase: str, rank: int) -> None:
    """Each rank with its own block-count cache (OUT_DIR/cache-RANK, which the test may have poisoned in a way the
    load-time check does not sample); "differ": rank 1 ends its dataset a day earlier. Records the steps run, or the
    error every rank stops with."""
    os.environ["KLINE_STORE_CACHE"] = str(out_dir / f"cache-{rank}")
    blocks_module.SAMPLE_SEGMENTS = 0            # the poison escapes the check when loaded: the ranks must find it
    if phase == "differ" and rank == 1:
        end = str(np.datetime64(end) - 1)
    record: dict = {"rank": rank}
    try:
        ds = KlineDataset(store, window=10, horizon=2, end=end, index="blocks")
        record["loaded"] = len(ds)
        ld = ds.loader(batch_size=32, seed=3, order="uniform")
        steps, seen = 0, []
        for batch in ld:
            n = torch.tensor([len(batch["y"])])
            dist.all_reduce(n)   # uneven step counts would hang here
            steps += 1
            seen += [[int(s), int(t)] for s, t in zip(batch["symbol"], batch["t"])]
        record.update(steps=steps, n=len(ds), seen=seen)
    except KlineStoreError as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    (out_dir / f"{phase}-{rank}.json").write_text(json.dumps(record))


def main(store: str, out: str, end: str, phase: str, steps: str = "0") -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out_dir = Path(out)
    if phase in ("counts", "differ"):
        counts(out_dir, store, end, phase, rank)
        dist.barrier()
        dist.destroy_process_group()
        return
    if phase in ("bhead", "btail"):
        blocks(out_dir, store, end, phase, int(steps), rank)
        dist.barrier()
        dist.destroy_process_group()
        return
    if phase == "race":
        current = open_store(store, verify=False).version     # the version a rank opening now would read
        ds = KlineDataset(store, window=10, horizon=2) if rank == 0 else None
        dist.barrier()
        if rank == 0:
            append(store, [end])
        dist.barrier()
        if ds is None:
            current = open_store(store, verify=False).version
            ds = KlineDataset(store, window=10, horizon=2)
        opened = current
    else:
        ds = KlineDataset(store, window=10, horizon=2, end=end)
        opened = ds.version
    ld = ds.loader(batch_size=32, seed=3)  # rank and world size come from torch.distributed
    if phase == "tail":
        ld.load_state_dict(json.loads((out_dir / f"state-{rank}.json").read_text()))
    seen: list[list[int]] = []
    n_steps = 0
    for batch in ld:
        # a collective per step, as DDP's gradient all-reduce: uneven step counts would hang here
        n = torch.tensor([len(batch["y"])])
        dist.all_reduce(n)
        seen += [[int(s), int(t)] for s, t in zip(batch["symbol"], batch["t"])]
        n_steps += 1
        if phase == "head" and n_steps == int(steps):
            (out_dir / f"state-{rank}.json").write_text(json.dumps(ld.state_dict()))
            break
    record = {"rank": ld.rank, "world": ld.world_size, "steps": n_steps, "seen": seen, "n": len(ds),
              "state": ld.state_dict(), "opened": opened, "version": ds.version}
    (out_dir / f"{phase}-{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:6])
