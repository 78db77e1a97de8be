"""feed/options.py: the loader's options are one object, and every keyword of every entry point that makes a
loader reaches it (the entry points' signatures are read here against the dataclass's fields, so a keyword added to
one of them and not passed on fails)."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import torch
from helpers_dataset_ref import make_store, random_panel

import kline_store as ks
from kline_store.errors import InputError
from kline_store.feed import loader as loader_module
from kline_store.feed.loader import KlineLoader
from kline_store.feed.options import DATALOADER_KEYWORDS, LoaderOptions
from kline_store.samples import cross_section, dataset, feature_windows

FIELDS = [f.name for f in dataclasses.fields(LoaderOptions)]


class Marker:
    """A value no default equals, one per option."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


class Recorded:
    """Stands in for KlineLoader: keeps what it was given."""

    def __init__(self, source, options=None, **keywords):
        assert not keywords, f"keywords forwarded by hand: {sorted(keywords)}"
        self.source, self.options = source, options


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    rng = np.random.default_rng(5)
    return make_store(tmp_path_factory.mktemp("options") / "s", random_panel(rng, 6, 120, holes=0.0))


@pytest.fixture
def recorded(monkeypatch):
    for module in (dataset, cross_section, feature_windows):
        monkeypatch.setattr(module, "KlineLoader", Recorded)


def test_the_loader_takes_every_option_and_nothing_else():
    params = inspect.signature(KlineLoader.__init__).parameters
    named = {n for n, p in params.items() if p.kind is not p.VAR_KEYWORD} - {"self", "source", "options"}
    assert named | set(DATALOADER_KEYWORDS) == set(FIELDS)
    with pytest.raises(InputError, match="unknown argument.*sampler"):
        LoaderOptions.of(sampler=None)


def _sources(path):
    return {"KlineDataset": ks.KlineDataset(path, window=8),
            "CrossSectionDataset": ks.CrossSectionDataset(path, window=8),
            "FeatureWindows": ks.FeatureWindows(path, 8, {"MA3": "Mean($close, 3)"})}


@pytest.mark.parametrize("kind", ["KlineDataset", "CrossSectionDataset", "FeatureWindows"])
def test_every_keyword_of_a_datasets_loader_reaches_the_loader(path, recorded, kind):
    source = _sources(path)[kind]
    params = inspect.signature(source.loader).parameters
    assert any(p.kind is p.VAR_KEYWORD for p in params.values()), "the loader's other options pass through"
    assert set(params) - {"options"} <= set(FIELDS), "a keyword of .loader() that is no loader option"
    given = {name: Marker(name) for name in FIELDS}
    made = source.loader(**given)
    assert made.source is source and isinstance(made.options, LoaderOptions)
    assert {n: getattr(made.options, n) for n in FIELDS} == given


def test_every_keyword_of_the_datamodule_reaches_each_splits_loader(path, recorded):
    pytest.importorskip("lightning.pytorch")
    from kline_store.lightning import KlineDataModule

    params = inspect.signature(KlineDataModule.__init__).parameters
    named = set(params) & set(FIELDS)
    assert named == {"batch_size", "seed", "num_workers", "drop_last", "device"}
    given = {name: Marker(name) for name in FIELDS if name not in ("shuffle", "tail", "device", "batch_size")}
    given["batch_size"], given["drop_last"] = 7, True
    dm = KlineDataModule(path, window=8, splits={"train": ("2020-01-01", "2020-03-01"), "val": ("2020-03-10", None)},
                         device="cpu", **given)
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert {n: getattr(train.options, n) for n in given} == given
    assert (train.options.shuffle, train.options.tail, train.options.device) == (True, "pad", torch.device("cpu"))
    assert (val.options.shuffle, val.options.tail, val.options.drop_last) == (False, "pad", False)
    for fixed in ("shuffle", "tail"):
        with pytest.raises(InputError, match=fixed):
            KlineDataModule(path, splits={"train": (None, None)}, **{fixed: False})


def test_make_splits_takes_no_loader_option_and_says_where_it_goes(path):
    named = set(inspect.signature(ks.make_splits).parameters) & set(FIELDS)
    assert named == set(), "a loader keyword of make_splits must reach a loader"
    for name in FIELDS:
        with pytest.raises(InputError, match=rf"make_splits\({name}=\.\.\.\): a loader option"):
            ks.make_splits(path, train=("2020-01-01", None), **{name: 1})


def test_options_or_keywords_not_both(path):
    ds = ks.KlineDataset(path, window=8)
    ld = KlineLoader(ds, options=LoaderOptions(batch_size=5, shuffle=False, num_workers=0))
    assert ld.batch_size == 5 and len(next(iter(ld))["x"]) == 5
    assert ld.options == LoaderOptions(batch_size=5, shuffle=False, num_workers=0)
    with pytest.raises(InputError, match="not both"):
        KlineLoader(ds, batch_size=5, options=LoaderOptions())
    same = ds.loader(batch_size=5, shuffle=False, num_workers=0)
    assert same.options == ld.options and loader_module.KlineLoader is KlineLoader
