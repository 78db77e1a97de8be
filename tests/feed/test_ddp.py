"""DDP under torchrun on gloo: one node with 2 ranks, and two nodes (two launchers on this machine, c10d
rendezvous on 127.0.0.1) with 2 ranks each, killed mid-epoch and restarted from the saved loader state. Each rank
gets a disjoint shard (the padded tail aside) with equal step counts, the shards cover every valid window, and the
restarted job continues exactly where the checkpoint was taken. The same in the block order, for windows and for
cross-sections, where each rank's share of blocks is also the same in epoch 0 and epoch 1 (a node rereads its
share from its own page cache)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers_dataset_ddp import DAYS
from helpers_dataset_ref import make_store, random_panel

from kline_store.feed import block_order
from kline_store.samples import blocks, day_blocks
from kline_store.samples.cross_section import CrossSectionDataset
from kline_store.samples.dataset import KlineDataset

HERE = Path(__file__).resolve().parents[1]   # tests/, where the helper scripts live


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(8)
    path = make_store(tmp_path_factory.mktemp("ddp") / "s", random_panel(rng, 10, 120, holes=0.05))
    # an end date that leaves a number of windows no world size of 2 or 4 divides: the uneven tail is tested
    for day in range(119, 100, -1):
        end = str(np.datetime64("2020-01-01") + day)
        if len(KlineDataset(path, window=10, horizon=2, end=end)) % 4 == 1:
            return path, end
    raise AssertionError("no suitable end date")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nodes: int, args: list[str], cwd: Path, **env: str) -> None:
    """torchrun with ``nodes`` launchers of 2 processes each on this machine; fail with their output."""
    helper = [str(HERE / "helpers_dataset_ddp.py"), *args]
    if nodes == 1:
        cmds = [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *helper]]
    else:
        port = _free_port()
        cmds = [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", "--nproc_per_node=2",
                 "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=kline-test",
                 f"--node_rank={k}", "--max_restarts=0", *helper] for k in range(nodes)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(**env),
                              cwd=cwd)
             for c in cmds]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)


def _read(out: Path, phase: str, world: int) -> list[dict]:
    return [json.loads((out / f"{phase}-{r}.json").read_text()) for r in range(world)]


def _check_shards(store_end: tuple[Path, str], seen: list[list[tuple[int, int]]], world: int) -> None:
    path, end = store_end
    ds = KlineDataset(path, window=10, horizon=2, end=end)
    n = len(ds)
    valid = set(zip(*(a.tolist() for a in ds.locate(np.arange(n)))))
    per_rank = -(-n // world)
    assert [len(s) for s in seen] == [per_rank] * world
    assert set().union(*map(set, seen)) == valid                      # every window
    assert sum(len(set(s)) for s in seen) - len(valid) == per_rank * world - n   # only the padded tail twice
    for r in range(world):   # and exactly the order a single process computes for that rank
        want = ds.loader(batch_size=32, seed=3, rank=r, world_size=world, num_workers=0)
        assert seen[r] == [(int(s), int(t)) for b in want for s, t in zip(b["symbol"], b["t"])]


def test_torchrun_two_ranks_cover_the_epoch(store, tmp_path):
    path, end = store
    _launch(1, [str(path), str(tmp_path), end, "full"], tmp_path)
    ranks = _read(tmp_path, "full", 2)
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["steps"] == ranks[1]["steps"]
    assert all(r["state"]["epoch"] == 1 and r["state"]["position"] == 0 for r in ranks)
    _check_shards(store, [[tuple(k) for k in r["seen"]] for r in ranks], 2)


def test_two_nodes_restart_from_the_saved_state(store, tmp_path):
    path, end = store
    _launch(2, [str(path), str(tmp_path), end, "head", "2"], tmp_path)   # stopped after 2 steps: a crash
    _launch(2, [str(path), str(tmp_path), end, "tail"], tmp_path)        # a new job, ranks reassigned
    head, tail = _read(tmp_path, "head", 4), _read(tmp_path, "tail", 4)
    assert {r["world"] for r in head + tail} == {4}
    assert all(r["steps"] == 2 and r["state"]["position"] == 64 for r in head)
    assert len({r["steps"] for r in tail}) == 1                           # equal steps on every rank
    seen = [[tuple(k) for k in h["seen"] + t["seen"]] for h, t in zip(head, tail)]
    _check_shards(store, seen, 4)


def test_ranks_opening_on_either_side_of_an_append_train_on_one_version(tmp_path):
    """Issue 19: two ranks that opened the store before and after an append trained on different versions: their
    "disjoint" shards overlapped by half and their step counts differed (a collective then dies or hangs)."""
    rng = np.random.default_rng(9)
    path = make_store(tmp_path / "s", random_panel(rng, 10, 120, holes=0.0))
    days = [str(np.datetime64("2020-01-01") + 120 + d) for d in range(60)]
    rows = "".join(f"S{s:03d},{d},1,2,0.5,1.5,100,150\n" for s in range(10) for d in days)
    new = tmp_path / "new.csv"
    new.write_text("symbol,date,open,high,low,close,volume,amount\n" + rows)
    _launch(1, [str(path), str(tmp_path), str(new), "race"], tmp_path)
    ranks = _read(tmp_path, "race", 2)
    assert [r["opened"] for r in ranks] == [1, 2]                       # the append came between the opens
    assert ranks[0]["version"] == ranks[1]["version"] == 1              # the first rank's version, on both
    assert ranks[0]["steps"] == ranks[1]["steps"] and ranks[0]["n"] == ranks[1]["n"]
    a, b = ({tuple(k) for k in r["seen"]} for r in ranks)
    n = ranks[0]["n"]
    assert len(a & b) <= 1 and len(a | b) == n                          # disjoint but for the padded tail
    assert all(r["state"]["version"] == 1 for r in ranks)


def test_two_nodes_block_order_fixed_shares_and_restart(store, tmp_path, monkeypatch):
    """order="blocks" on two launchers of 2 ranks: stopped after 3 steps of epoch 0, restarted from the saved state
    for the rest of it and epoch 1. Both epochs disjoint and complete, each rank's order exactly the one a single
    process computes for it, each rank's blocks the same in both epochs, and one block size on every rank."""
    path, end = store
    cache = str(tmp_path / "cache")
    monkeypatch.setenv("KLINE_STORE_CACHE", cache)
    _launch(2, [str(path), str(tmp_path), end, "bhead", "3"], tmp_path, KLINE_STORE_CACHE=cache)
    _launch(2, [str(path), str(tmp_path), end, "btail"], tmp_path, KLINE_STORE_CACHE=cache)
    head, tail = _read(tmp_path, "bhead", 4), _read(tmp_path, "btail", 4)
    world = 4
    assert len({r["agreed"] for r in head}) == 1 and head[0]["agreed"] in range(10, 14)   # the first to ask
    ds = KlineDataset(path, window=10, horizon=2, end=end, index="blocks")
    monkeypatch.setattr(day_blocks, "SEG_ROW_BYTES", DAYS * 4 * ds.store.n_fields)
    xs = CrossSectionDataset(ds)
    s, t = ds.locate(np.arange(len(ds)))
    where = {"win": {(int(a), int(b)): i for i, (a, b) in enumerate(zip(s, t))},
             "xs": {int(d): i for i, d in enumerate(xs.days)}}
    for kind, src, batch in (("win", ds, 8), ("xs", xs, 2)):
        size = {r["state"][kind]["block_bytes"] for r in head + tail}
        assert len(size) == 1                                   # one block size, agreed by the ranks
        counts, seg_bytes = src.block_segments()
        off = block_order.offsets(block_order.group_segments(counts, size.pop() // seg_bytes))
        n = len(src)
        shares = []
        for epoch in (0, 1):
            seen = [[where[kind][tuple(k) if kind == "win" else k] for k in
                     (h["seen"][kind][0] + r["seen"][kind][0] if epoch == 0 else r["seen"][kind][1])]
                    for h, r in zip(head, tail)]
            assert [len(p) for p in seen] == [-(-n // world)] * world          # equal steps
            assert set().union(*map(set, seen)) == set(range(n))             # every sample
            assert sum(len(set(p)) for p in seen) == n                       # disjoint, the padded tail aside
            for r in range(world):   # exactly the order one process computes for the rank (the restart included)
                ld = src.loader(batch_size=batch, seed=3, rank=r, world_size=world, order="blocks", pool_blocks=2,
                                block_bytes=head[r]["state"][kind]["block_bytes"], num_workers=0)
                ld.set_epoch(epoch)
                assert seen[r] == np.concatenate(list(ld.index_batches())).tolist()
            shares.append([set((np.searchsorted(off, p, "right") - 1).tolist()) for p in seen])
        assert shares[0] == shares[1]                            # each rank's blocks: the same in both epochs
        assert sum(map(len, shares[0])) - len(set.union(*shares[0])) <= world - 1   # only cut blocks shared
        assert len(set.union(*shares[0])) == len(off) - 1 - int((np.diff(off) == 0).sum())


def _poison(store: Path, end: str, cache: Path, monkeypatch) -> tuple[int, int]:
    """Counts in ``cache`` with half of the first row's windows, which the load-time check passes when it samples no
    segment (as the helper makes it): ``(true count, poisoned count)``."""
    monkeypatch.setenv("KLINE_STORE_CACHE", str(cache))
    n = len(KlineDataset(store, window=10, horizon=2, end=end, index="blocks"))
    (path,) = (cache / "blocks").glob("*.npz")
    z = dict(np.load(path))
    z["counts"][0, 0] //= 2
    np.savez(path, **z)
    monkeypatch.setattr(blocks, "SAMPLE_SEGMENTS", 0)
    return n, len(KlineDataset(store, window=10, horizon=2, end=end, index="blocks"))


@pytest.mark.parametrize("poisoned", [0, 1])
def test_ranks_with_different_cached_counts_agree_before_the_first_step(store, tmp_path, monkeypatch, poisoned):
    """Issue 26: two ranks whose block-count caches differ ran 194 and 97 steps (a DDP run hangs at the shorter
    one's end). Now the ranks compare their counts, count again from the store and run the true samples, the
    same steps on both, whichever rank's cache was wrong (the first rank's too)."""
    path, end = store
    n, bad = _poison(path, end, tmp_path / f"cache-{poisoned}", monkeypatch)
    assert bad < n
    _launch(1, [str(path), str(tmp_path), end, "counts"], tmp_path)
    ranks = _read(tmp_path, "counts", 2)
    assert ranks[poisoned]["loaded"] == bad and ranks[1 - poisoned]["loaded"] == n   # what each loaded
    assert [r["n"] for r in ranks] == [n, n] and ranks[0]["steps"] == ranks[1]["steps"]
    _check_shards(store, [[tuple(k) for k in r["seen"]] for r in ranks], 2)
    (fixed,) = (tmp_path / f"cache-{poisoned}" / "blocks").glob("*.npz")
    assert int(np.load(fixed)["counts"].sum()) == n                                 # the cache counted again


def test_ranks_whose_datasets_differ_stop_in_one_line(store, tmp_path):
    """Ranks whose datasets cannot agree (rank 1 ends a day earlier: another store at the path on some node would do
    the same) all stop before the first step with the same one-line InputError naming each rank's count."""
    path, end = store
    _launch(1, [str(path), str(tmp_path), end, "differ"], tmp_path)
    ranks = _read(tmp_path, "differ", 2)
    errors = {r["error"] for r in ranks}
    assert len(errors) == 1 and "steps" not in ranks[0] and "steps" not in ranks[1]
    (msg,) = errors
    assert msg.startswith("InputError: ") and "\n" not in msg
    assert "differ after counting again" in msg and "rank 0: " in msg and "rank 1: " in msg
