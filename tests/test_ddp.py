"""DDP: the loader under torchrun --nproc_per_node=2 on the gloo backend gives each rank a disjoint shard
(the padded tail aside) with equal step counts, covering every valid window."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers_dataset_ref import make_store, random_panel

from kline_store.dataset import KlineDataset

HERE = Path(__file__).resolve().parent


def test_torchrun_two_ranks_cover_the_epoch(tmp_path):
    rng = np.random.default_rng(8)
    store = make_store(tmp_path / "s", random_panel(rng, 10, 120, holes=0.05))
    # pick an end date that leaves an odd number of windows: the uneven tail is part of the test
    end = None
    for day in range(119, 100, -1):
        cand = str(np.datetime64("2020-01-01") + day)
        ds = KlineDataset(store, window=10, horizon=2, end=cand)
        if len(ds) % 2 == 1:
            end, n = cand, len(ds)
            break
    assert end is not None
    valid = set(zip(*(a.tolist() for a in ds.locate(np.arange(n)))))
    out = tmp_path / "ddp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(HERE / "helpers_dataset_ddp.py"), str(store), str(out), end],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["n"] == n
    ranks = sorted(res["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world"] for r in ranks} == {2}
    assert ranks[0]["steps"] == ranks[1]["steps"] == -(-((n + 1) // 2) // 32)
    seen = [[tuple(k) for k in r["seen"]] for r in ranks]
    assert len(seen[0]) == len(seen[1]) == (n + 1) // 2
    assert set(seen[0]) | set(seen[1]) == valid  # every window
    both = set(seen[0]) & set(seen[1])
    assert len(both) == 1 and len(set(seen[0])) + len(set(seen[1])) == n + 1  # one window padded twice
    assert all(r["state"]["epoch"] == 1 and r["state"]["position"] == 0 for r in ranks)
