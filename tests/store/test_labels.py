"""store/labels.py: a field stored k bars after the day it describes is read on that day by every exit (row views,
exports) and by the datasets: one rule. On the real A-share files, a features store's LABEL0."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kline_store as ks
from kline_store.ingest.exporter import export
from kline_store.store import create_store, labels, open_store

DAYS = np.arange(np.datetime64("2021-01-04"), np.datetime64("2021-01-04") + 12)


@settings(max_examples=100, deadline=None)
@given(ahead=st.lists(st.integers(0, 4), min_size=3, max_size=3), lo=st.integers(0, 11), width=st.integers(0, 12),
       cols=st.lists(st.integers(0, 2), min_size=1, max_size=3), rows=st.lists(st.integers(0, 3), max_size=4))
def test_values_on_their_day(ahead, lo, width, cols, rows):
    panel = np.random.default_rng(0).normal(size=(4, 12, 3)).astype(np.float32)
    hi = min(11, lo + width - 1)
    got = labels.on_their_day(panel, np.array(rows, dtype=np.int64), lo, hi, cols, ahead)
    assert got.shape == (len(rows), max(0, hi - lo + 1), len(cols)) and got.dtype == np.float32
    for i, r in enumerate(rows):
        for d in range(lo, hi + 1):
            for j, c in enumerate(cols):
                u = d + ahead[c]
                want = panel[r, u, c] if u < 12 else np.nan
                assert np.array_equal(got[i, d - lo, j], want, equal_nan=True)


def test_lookahead_of_an_untrusted_manifest():
    m = {"features": {"fields": [{"name": "A", "lookahead": 2}, {"name": "B", "lookahead": True},
                                 {"name": "C", "lookahead": -1}, {"name": "D", "lookahead": 2.0},
                                 {"name": "E", "lookahead": 1 << 30}, {"name": "A", "lookahead": 5}, "junk"]}}
    assert labels.lookahead(m) == {"A": 2}
    assert labels.shifts(m, ["B", "A", "X"]) == [0, 2, 0]
    assert labels.lookahead({}) == {} and labels.lookahead({"features": [1]}) == {}


@pytest.fixture
def label_store(tmp_path):
    """close and a label stored two bars after its day (LABEL0's layout), symbol B with no bar on its last days."""
    rng = np.random.default_rng(3)
    close = rng.uniform(10, 20, size=(2, 12)).astype(np.float32)
    close[1, 9:] = np.nan
    label = np.full_like(close, np.nan)
    label[:, 2:] = close[:, 2:] / close[:, 1:-1] - 1           # the label of day t, stored at t + 2
    path = tmp_path / "f"
    meta = {"fields": [{"name": "close", "expr": "$close", "lookback": 0, "lookahead": 0},
                       {"name": "LABEL0", "expr": "Ref($close, -2)/Ref($close, -1) - 1", "lookback": 0,
                        "lookahead": 2}], "label": "LABEL0"}
    create_store(path, np.stack([close, label], axis=2), ["A", "B"], DAYS, ["close", "LABEL0"],
                 extra={"features": meta})
    return path, close


def test_row_views_and_exports_put_the_label_on_its_day(label_store, tmp_path):
    path, close = label_store
    st_ = open_store(path)
    df = st_.to_polars()
    want = np.full((2, 12), np.nan, dtype=np.float32)
    want[:, :-2] = close[:, 2:] / close[:, 1:-1] - 1
    for s, sym in enumerate(["A", "B"]):
        rows = df.filter(pl.col("symbol") == sym)
        d = np.searchsorted(DAYS, rows["date"].to_numpy().astype("datetime64[D]"))
        np.testing.assert_array_equal(rows["LABEL0"].to_numpy(), want[s, d])
        assert rows["LABEL0"].tail(2).is_nan().all()                    # the last two days: not known yet
    assert df.filter(pl.col("symbol") == "B").height == 9               # rows: its bars
    wide = st_.to_pandas(fields="LABEL0", wide=True)
    np.testing.assert_array_equal(wide.to_numpy().T, want)
    sub = st_.to_polars(start=str(DAYS[3]), end=str(DAYS[5]), fields=["LABEL0"])
    np.testing.assert_array_equal(sub["LABEL0"].to_numpy().reshape(2, 3), want[:, 3:6])
    for fmt in ("parquet", "csv"):
        export(path, tmp_path / f"out.{fmt}")
        back = pl.read_parquet(tmp_path / "out.parquet") if fmt == "parquet" else \
            pl.read_csv(tmp_path / "out.csv", schema_overrides={"LABEL0": pl.Float32, "close": pl.Float32})
        np.testing.assert_array_equal(back["LABEL0"].fill_null(np.nan).to_numpy(), df["LABEL0"].to_numpy())


def test_the_datasets_read_the_same_value(label_store):
    """One rule: a dataset's label of (symbol, t) is the row view's LABEL0 of that day."""
    path, _ = label_store
    st_ = open_store(path)
    ds = ks.KlineDataset(path, window=1)
    assert ds.horizon == 2
    b = ds.gather_batch(np.arange(len(ds)))
    rows = st_.to_polars()
    index = {(s, str(d)): v for s, d, v in zip(rows["symbol"], rows["date"], rows["LABEL0"])}
    got = [index[(st_.symbols[int(s)], str(DAYS[int(t)]))] for s, t in zip(b["symbol"], b["t"])]
    assert torch.allclose(b["y"], torch.tensor(got), rtol=1e-6)


def test_a_features_store_of_real_bars(real, tmp_path):
    """compute_features' LABEL0 on the A-share files: the row view's LABEL0 of day t is close[t+2]/close[t+1] - 1."""
    files = sorted((real / "ashare_qfq_daily" / "data_20251009").glob("*.csv"))[:12]
    ks.ingest(files, tmp_path / "bars")
    ks.compute_features(tmp_path / "bars", tmp_path / "feats", sets=[], exprs={"MA5": "Mean($close, 5)"})
    bars, feats = open_store(tmp_path / "bars"), open_store(tmp_path / "feats")
    df = feats.to_polars()
    c = bars.array("close").astype(np.float64)
    s = np.searchsorted(np.asarray(feats.symbols), df["symbol"].to_numpy())
    t = np.searchsorted(feats.dates, df["date"].to_numpy().astype("datetime64[D]"))
    ok = t + 2 < bars.n_dates
    want = np.full(len(t), np.nan)
    want[ok] = c[s[ok], t[ok] + 2] / c[s[ok], t[ok] + 1] - 1
    got = df["LABEL0"].to_numpy().astype(np.float64)
    both = np.isfinite(want) & np.isfinite(got)
    assert both.sum() > 0.95 * len(got)
    np.testing.assert_allclose(got[both], want[both], rtol=1e-5, atol=1e-7)
    assert np.isnan(got[np.isnan(want)]).all()
