"""A plain torch DataLoader over our datasets: one gather per batch through __getitems__, the same batch dicts as
ds.loader, in the main process and in fork and spawn workers (which hand batches over a shared-memory ring)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel
from torch.utils.data import DataLoader, default_collate

from kline_store.feed import shm
from kline_store.feed.collate import GatheredBatch, SampleRow
from kline_store.samples.cross_section import CrossSectionDataset
from kline_store.samples.dataset import KlineDataset


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    rng = np.random.default_rng(8)
    path = make_store(tmp_path_factory.mktemp("collate") / "s", random_panel(rng, 10, 120, holes=0.05))
    return KlineDataset(path, window=8, horizon=1)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kw", [{}, {"num_workers": 2, "multiprocessing_context": "fork"},
                                {"num_workers": 1, "multiprocessing_context": "spawn", "persistent_workers": True}],
                         ids=["main", "fork", "spawn"])
def test_plain_dataloader_gives_the_loader_batches(ds, kw):
    want = list(ds.loader(batch_size=32, shuffle=False, num_workers=0))
    dl = DataLoader(ds, batch_size=32, shuffle=False, **kw)
    before = len(shm._attached)
    for _ in range(2):   # a second epoch reuses the workers' ring slots
        got = list(dl)   # all held at once: no slot may be refilled while a batch views it
        assert len(got) == len(want)
        assert all(type(g) is dict and _same(g, w) for g, w in zip(got, want))
    if kw:               # workers handed batches over their rings (one per worker), not per-batch segments
        assert len(shm._attached) > before


def test_shuffled_dataloader_with_the_classic_recipe(ds):
    dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=2, pin_memory=False, prefetch_factor=4,
                    persistent_workers=True, multiprocessing_context="fork")
    seen = []
    for b in dl:
        assert b["x"].shape[1:] == (8, 6)
        want = ds.gather_flat(b["symbol"].numpy() * ds.store.n_dates + b["t"].numpy())
        assert _same(b, want)
        seen += list(zip(b["symbol"].tolist(), b["t"].tolist()))
    assert len(seen) == len(set(seen)) == len(ds)


def test_a_custom_collate_still_sees_samples(ds):
    def first_y(samples):
        assert isinstance(samples, GatheredBatch) and len(samples) == 5
        assert all(isinstance(s, SampleRow) and isinstance(s["symbol"], int) for s in samples)
        return torch.stack([s["y"] for s in samples])

    for kw in ({}, {"num_workers": 1, "multiprocessing_context": "fork"}):
        got = next(iter(DataLoader(ds, batch_size=5, collate_fn=first_y, **kw)))
        assert torch.equal(got, ds.gather_batch(np.arange(5))["y"])
    rows = [ds[i] for i in range(3)]
    stacked = default_collate(rows)   # plain per-sample dicts collate as usual
    assert torch.equal(stacked["x"], ds.gather_batch(np.arange(3))["x"])


def test_single_samples_are_slices_of_the_batch(ds):
    idx = np.array([0, 7, len(ds) - 1])
    batch = ds.gather_batch(idx)
    for k, i in enumerate(idx):
        item = ds[int(i)]
        assert torch.equal(item["x"], batch["x"][k]) and torch.equal(item["y"], batch["y"][k])
        assert item["symbol"] == int(batch["symbol"][k]) and item["t"] == int(batch["t"][k])
    item["x"] += 1   # a sample is a copy: changing it changes nothing stored
    assert torch.equal(ds[int(idx[-1])]["x"], batch["x"][-1])


def test_cross_sections_through_a_plain_dataloader(ds):
    xs = CrossSectionDataset(ds)
    want = list(xs.loader(batch_size=4, shuffle=False, num_workers=0))
    for kw in ({}, {"num_workers": 2, "multiprocessing_context": "fork"}):
        got = list(DataLoader(xs, batch_size=4, **kw))
        assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
