"""samples/feature_windows.py: FeatureWindows gives ``y`` as a 0-d tensor like KlineDataset (issue 25: a float), and
its loader's state carries the store version and is refused on another (issue 26). (Values against a features
store: tests/features/test_training.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kline_store as ks
from kline_store.errors import InputError
from test_cross_section import revised_store

EXPRS = {"MA5": "Mean($close, 5)/$close", "STD10": "Std($close, 10)"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path, pin = revised_store(tmp_path_factory.mktemp("fw") / "s")
    yield path
    pin.close()


def test_a_sample_is_typed_as_a_klinedatasets(store):
    fw = ks.FeatureWindows(store, 6, EXPRS)
    ref = ks.KlineDataset(store, window=6)
    item, base = fw[3], ref[0]
    assert {k: type(v) for k, v in item.items()} == {k: type(v) for k, v in base.items() if k in item}
    assert isinstance(item["y"], torch.Tensor) and item["y"].shape == () and item["y"].dtype == torch.float32
    b = fw.gather_batch([3])
    assert torch.equal(item["y"], b["y"][0]) and torch.equal(item["x"], b["x"][0])
    assert item["symbol"] == int(b["symbol"][0]) and item["t"] == int(b["t"][0])
    assert torch.equal(fw[-1]["x"], fw[len(fw) - 1]["x"])
    with pytest.raises(IndexError, match="out of range"):
        fw[len(fw)]


def test_a_state_carries_the_version_and_is_refused_on_another(store):
    old = ks.FeatureWindows(store, 6, EXPRS, version=1)
    new = ks.FeatureWindows(store, 6, EXPRS)
    assert (old.version, new.version) == (1, 2) and len(old) == len(new)
    ld = old.loader(batch_size=16, num_workers=0)
    next(iter(ld))
    state = ld.state_dict()
    assert state["version"] == 1
    with pytest.raises(InputError, match="taken on store version 1; this dataset reads version 2"):
        new.loader(batch_size=16, num_workers=0).load_state_dict(state)
    ks.FeatureWindows(store, 6, EXPRS, version=1).loader(batch_size=16, num_workers=0).load_state_dict(state)
