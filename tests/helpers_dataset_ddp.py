"""Run under torchrun (gloo): every rank iterates its shard of the loader and writes what it saw.

Usage: python -m torch.distributed.run ... helpers_dataset_ddp.py STORE OUT_DIR END PHASE [STEPS]

PHASE "full": the whole epoch; "head": the first STEPS batches, then the loader state is saved as a checkpoint
would; "tail": a restarted job loads that state and runs the rest of the epoch; "race": END is a file that
rank 0 appends to the store after it opened it and before rank 1 opens it (the ranks then agree on one version).
Files are keyed by global rank.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from kline_store import append, open_store
from kline_store.samples.dataset import KlineDataset


def main(store: str, out: str, end: str, phase: str, steps: str = "0") -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir = Path(out)
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
