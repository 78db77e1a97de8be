"""Run under torchrun (gloo): every rank iterates its shard of the loader; rank 0 writes what all ranks saw.

Usage: python -m torch.distributed.run --standalone --nproc_per_node=N helpers_dataset_ddp.py STORE OUT.json END
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from kline_store.dataset import KlineDataset


def main(store: str, out: str, end: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = KlineDataset(store, window=10, horizon=2, end=end)
    ld = ds.loader(batch_size=32, seed=3)  # rank and world size come from torch.distributed
    seen: list[list[int]] = []
    steps = 0
    for batch in ld:
        # a collective per step, as DDP's gradient all-reduce: uneven step counts would hang here
        n = torch.tensor([len(batch["y"])])
        dist.all_reduce(n)
        seen += [[int(s), int(t)] for s, t in zip(batch["symbol"], batch["t"])]
        steps += 1
    state = ld.state_dict()
    everyone: list = [None] * world
    dist.all_gather_object(everyone, {"rank": ld.rank, "world": ld.world_size, "steps": steps, "seen": seen,
                                      "state": state})
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"n": len(ds), "ranks": everyone}, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
