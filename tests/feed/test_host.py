"""host.py: how a chunk is split between gather threads, and that any split gathers the same batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel

from kline_store.feed import host
from kline_store.feed.chunks import DEVICE_CHUNK_BYTES, batches_per_chunk
from kline_store.samples.dataset import KlineDataset


def test_parts_are_never_smaller_than_the_minimum():
    mib = 1 << 20
    assert host.parts_per_chunk(8, 8 * mib) == 4        # 8 threads, 8 MiB: 4 parts of 2 MiB, not 8 of 1 MiB
    assert host.parts_per_chunk(2, 8 * mib) == 2
    assert host.parts_per_chunk(16, 64 * mib) == 16
    assert host.parts_per_chunk(8, mib) == 1            # a small chunk is one thread's
    assert host.parts_per_chunk(0, 64 * mib) == 1


def test_layout_bytes():
    layout = {"x": ((64, 6), torch.float32), "y": ((), torch.float32), "t": ((), torch.int64),
              "observed": ((64,), torch.bool)}
    assert host.layout_nbytes(layout) == 64 * 6 * 4 + 4 + 8 + 64


def test_a_gpu_resident_chunk_holds_more_batches():
    layout = {"x": ((64, 6), torch.float32)}
    assert batches_per_chunk(layout, 1024) == 5
    assert batches_per_chunk(layout, 1024, DEVICE_CHUNK_BYTES) == 42


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_any_split_between_threads_gathers_the_same_batches(tmp_path, monkeypatch, n_threads):
    monkeypatch.setattr(host, "MIN_PART_BYTES", 1)   # parts of a few windows: every thread gets a piece
    store = make_store(tmp_path / "s", random_panel(np.random.default_rng(2), 6, 120, holes=0.05))
    ds = KlineDataset(store, window=5)
    ref = list(ds.loader(batch_size=16, seed=4, num_workers=0))
    got = list(ds.loader(batch_size=16, seed=4, num_workers=n_threads))
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert all(torch.equal(torch.nan_to_num(g[k]), torch.nan_to_num(r[k])) for k in r)
