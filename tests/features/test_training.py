"""Training on a features store: its features are the inputs and its label the target by default, the label is
read as far ahead as it looks (LABEL0: 2 bars), so no sample's label comes from beyond its split's end."""

from __future__ import annotations

import numpy as np
import pytest
from test_compute import bars, write_folder

from kline_store import CrossSectionDataset, KlineDataset, compute_features, ingest, make_splits, open_store
from kline_store.errors import InputError

EXPRS = {"RET1": "$close/Ref($close, 1) - 1", "MA5": "Mean($close, 5)/$close", "VOL": "Log($volume)"}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    base = tmp / "base"
    ingest([write_folder(tmp / "a", bars(3, 6, 120))], base)
    feats = tmp / "feats"
    compute_features(base, feats, sets=[], exprs=EXPRS)
    return base, feats


def test_defaults_are_the_features_and_their_label(stores):
    base, feats = stores
    ds = KlineDataset(feats, window=4)
    assert ds.fields == list(EXPRS) and ds.horizon == 2 and "LABEL0" in repr(ds)
    close = np.asarray(open_store(base).array("close"), dtype=np.float64)
    for i in range(0, len(ds), 37):
        s, t = (int(v[0]) for v in ds.locate(np.array([i])))
        y = float(ds[i]["y"])
        assert y == pytest.approx(close[s, t + 2] / close[s, t + 1] - 1, rel=1e-4, abs=1e-7)
    with pytest.raises(InputError, match="horizon must be 2"):
        KlineDataset(feats, window=4, horizon=1)


def test_splits_keep_labels_inside_their_range(stores):
    _, feats = stores
    st = open_store(feats)
    sp = make_splits(feats, train=(None, st.dates[60]), valid=(None, st.dates[90]), test=(None, None), window=3)
    for ds, end in ((sp.train, 60), (sp.valid, 90)):
        _, t = ds.locate(np.arange(len(ds)))
        assert t.max() + 2 <= end                      # the label day (t + 2) is at or before the split's end
    _, t_valid = sp.valid.locate(np.arange(len(sp.valid)))
    assert t_valid.min() >= 60 + 2                     # the embargo: the label's reach


def test_cross_sections_of_features(stores):
    _, feats = stores
    cs = CrossSectionDataset(feats, window=1)
    batch = cs[len(cs) // 2]
    assert batch["x"].shape[-1] == len(EXPRS) and cs.windows.horizon == 2


def test_features_on_the_fly_equal_the_features_store(stores, tmp_path):
    from kline_store import FeatureWindows
    base, _ = stores
    exprs = {"MA5": "Mean($close, 5)/$close", "STD10": "Std($close, 10)", "CORR5": "Corr($close, $volume, 5)",
             "IMAX5": "IdxMax($high, 5)"}
    feats = tmp_path / "f"
    compute_features(base, feats, sets=[], exprs=exprs, label=None)
    fw = FeatureWindows(base, 6, exprs)
    assert fw.extra == 9 and fw.fields == list(exprs) and fw.horizon == 1
    stored = np.array(open_store(feats).panel)
    idx = np.arange(0, len(fw), 7)
    b = fw.gather_batch(idx)
    s, t = fw.base.locate(idx)
    for k in range(len(idx)):
        want = stored[s[k], t[k] - 5: t[k] + 1]
        np.testing.assert_allclose(b["x"][k].numpy(), want, rtol=1e-5, atol=1e-6)
    batches = list(fw.loader(batch_size=16, num_workers=2))
    assert sum(len(x["y"]) for x in batches) == len(fw) and batches[0]["x"].shape[1:] == (6, 4)
    with pytest.raises(InputError, match="look ahead"):
        FeatureWindows(base, 6, {"L": "Ref($close, -1)"})
    with pytest.raises(InputError, match="whole series"):
        FeatureWindows(base, 6, {"E": "EMA($close, 5)"})
