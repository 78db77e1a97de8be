#!/usr/bin/env python
"""Memory of N DDP ranks on one node reading one store: shared page cache, not N copies.

    python scripts/bench_ddp_memory.py [STORE] [--ranks 2] [--samples 1000000]

Launches ``torchrun --nproc_per_node=RANKS`` (gloo). Each rank opens the store, builds its dataset and loader
with the defaults, reads SAMPLES windows of its shard, and reports from /proc: its private (anonymous) memory
growth, its PSS (proportional set size: shared pages divided among the processes mapping them) and the RSS of
the store mapping. Without STORE (or with one smaller than 8x the L3 cache) a synthetic store of that size is
made. Prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def status_kib(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def rollup_kib(key: str) -> int:
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def mapping_kib(path: str) -> dict[str, int]:
    """Rss, Pss and Anonymous (copy-on-write copies) of every mapping of ``path`` in this process, summed."""
    total = {"Rss": 0, "Pss": 0, "Anonymous": 0}
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" in head[3]:   # a mapping's header line
            inside = len(head) >= 6 and head[5] == path
        elif inside and head[0].rstrip(":") in total:
            total[head[0].rstrip(":")] += int(head[1])
    return total


def rank_main(store: str, samples: int, out: str) -> None:
    import torch.distributed as dist

    from kline_store import KlineDataset
    from kline_store.measure.timing import time_batches

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    anon0 = status_kib("RssAnon")
    ds = KlineDataset(store, window=64)
    anon_index = status_kib("RssAnon")
    ld = ds.loader(batch_size=256, seed=0)
    timing = time_batches(ld, samples=samples, warmup_batches=0)
    dist.barrier()   # every rank has touched its windows before anyone measures
    mapped = mapping_kib(str(ds.store.data_file.resolve()))
    rec = {"rank": rank, "panel_mib": ds.store.logical_bytes / 2**20, "index_mib": ds.valid_index().nbytes / 2**20,
           "store_rss_mib": mapped["Rss"] / 1024, "store_pss_mib": mapped["Pss"] / 1024,
           "store_cow_mib": mapped["Anonymous"] / 1024,
           "anon_growth_mib": (status_kib("RssAnon") - anon0) / 1024,
           "anon_after_index_mib": (anon_index - anon0) / 1024, "pss_mib": rollup_kib("Pss") / 1024,
           "pss_file_mib": rollup_kib("Pss_File") / 1024, "rss_file_mib": status_kib("RssFile") / 1024,
           "windows_per_s": timing.samples_per_s, "loader": repr(ld)}
    Path(out, f"rank-{rank}.json").write_text(json.dumps(rec))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", nargs="?")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--rank-main", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_main:
        store, samples, out = args.rank_main
        rank_main(store, int(samples), out)
        return
    from kline_store import open_store
    from kline_store.measure import synthetic

    with tempfile.TemporaryDirectory(prefix="kline-ddp-mem-") as tmp:
        store = args.store
        l3 = synthetic.l3_bytes()
        if store is None or open_store(store, verify=False).logical_bytes < 8 * l3:
            n_sym, n_dates, _ = synthetic.shape_for(8 * l3)
            store = str(synthetic.make_store(Path(tmp) / "store", n_sym, n_dates))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
               __file__, "--rank-main", store, str(args.samples), tmp]
        subprocess.run(cmd, check=True, env=env)
        recs = [json.loads(Path(tmp, f"rank-{r}.json").read_text()) for r in range(args.ranks)]
    panel = recs[0]["panel_mib"]
    print(f"store panel {panel:.0f} MiB; {args.ranks} ranks on one node, each reading {args.samples:,} windows "
          f"of its shard with ds.loader() defaults")
    print(f"{'rank':>4} {'private growth':>15} {'of panel':>9} {'after index':>12} {'(index)':>9} {'store RSS':>10} {'store PSS':>10} "
          f"{'COW copies':>11} {'windows/s':>12}")
    for r in recs:
        print(f"{r['rank']:>4} {r['anon_growth_mib']:>11.0f} MiB {100 * r['anon_growth_mib'] / panel:>8.0f}% "
              f"{r['anon_after_index_mib']:>8.0f} MiB {r['index_mib']:>5.0f} MiB {r['store_rss_mib']:>6.0f} MiB {r['store_pss_mib']:>6.0f} MiB "
              f"{r['store_cow_mib']:>7.0f} MiB {r['windows_per_s']:>12,.0f}")
    print(f"store pages resident per rank {recs[0]['store_rss_mib']:.0f} MiB, PSS summed over ranks "
          f"{sum(r['store_pss_mib'] for r in recs):.0f} MiB: one copy in the page cache for all ranks "
          f"(private copies would take {args.ranks} x {panel:.0f} MiB)")


if __name__ == "__main__":
    main()
