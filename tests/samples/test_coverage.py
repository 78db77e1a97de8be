"""samples/coverage.py: default fields that keep every symbol (issue 25: in an 11-symbol store where one file has
``amount``, the default gave 683 windows, all of that one symbol, and nobody was told), and the note when a field
leaves symbols with no window."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import kline_store as ks
from kline_store.errors import InputError
from kline_store.samples import coverage
from helpers_dataset_ref import make_store


@pytest.fixture(autouse=True)
def _fresh_notes(monkeypatch, tmp_path):
    monkeypatch.setattr(coverage, "_NOTED", set())
    monkeypatch.setenv("KLINE_STORE_CACHE", str(tmp_path / "cache"))


def bars(n_sym: int, n_dates: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_dates)), axis=1))
    panel = np.stack([close, close * 1.01, close * 0.99, close, rng.lognormal(10, 1, close.shape),
                      rng.lognormal(14, 1, close.shape)], axis=2).astype(np.float32)
    return panel


@pytest.fixture(scope="module")
def one_with_amount(tmp_path_factory):
    panel = bars(11, 200)
    panel[1:, :, 5] = np.nan                     # only the first file had an amount column
    return make_store(tmp_path_factory.mktemp("cov") / "s", panel)


def symbols_of(ds) -> set[int]:
    return set(ds.locate(np.arange(len(ds)))[0].tolist())


def notes(rec) -> list[str]:
    return [str(w.message) for w in rec if "kline-store" in str(w.message)]


@pytest.mark.parametrize("index", ["full", "blocks"])
def test_a_field_only_some_symbols_have_is_left_out_of_the_default_and_named_once(one_with_amount, index):
    with pytest.warns(RuntimeWarning) as rec:
        ds = ks.KlineDataset(one_with_amount, window=32, index=index)
        ks.KlineDataset(one_with_amount, window=16, index=index)           # said once, not per dataset
    assert notes(rec) == [f"kline-store: {one_with_amount}: amount: 1 of 11 symbols; left out of the default fields "
                          f"(open, high, low, close, volume); pass fields=[...] to use it"]
    assert ds.fields == ["open", "high", "low", "close", "volume"]
    assert symbols_of(ds) == set(range(11)) and len(ds) == 11 * (200 - 32)
    again = pickle.loads(pickle.dumps(ds))                                 # a worker reads the same fields
    assert again.fields == ds.fields and len(again) == len(ds)


@pytest.mark.parametrize("index", ["full", "blocks"])
def test_a_field_that_leaves_symbols_without_a_window_is_named_with_how_many(one_with_amount, index):
    with pytest.warns(RuntimeWarning) as rec:
        ds = ks.KlineDataset(one_with_amount, window=32, fields=["close", "amount"], index=index)
    assert symbols_of(ds) == {0}
    assert notes(rec) == [f"kline-store: {one_with_amount}: field 'amount' has no value in range for 10 of the 11 "
                          f"symbols with bars there: they have no window; leave it out of fields= to keep them"]


def test_a_field_missing_only_in_the_range_is_named_and_nothing_said_when_all_have_windows(tmp_path):
    panel = bars(4, 300, seed=1)
    panel[2, 150:, 5] = np.nan                   # symbol 2's amount ends halfway
    path = make_store(tmp_path / "s", panel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # every symbol has amount somewhere, and windows before day 150
        assert ks.KlineDataset(path, window=8).fields[-1] == "amount"
    with pytest.warns(RuntimeWarning, match=r"field 'amount' has no value in range for 1 of the 4 symbols"):
        late = ks.KlineDataset(path, window=8, start="2020-07-01")
    assert symbols_of(late) == {0, 1, 3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ks.KlineDataset(path, window=8, start="2020-07-01", fields=["close", "volume"])   # its windows kept: no note


def test_splits_and_subsets_read_the_same_default(one_with_amount):
    with pytest.warns(RuntimeWarning) as rec:
        sp = ks.make_splits(one_with_amount, train=("2020-01-01", "2020-04-30"), val=("2020-05-10", "2020-07-18"),
                            window=16, normalize="zscore")
    assert len(notes(rec)) == 1
    assert sp.train.fields == sp.val.fields == ["open", "high", "low", "close", "volume"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # the one symbol that has amount, alone: it is kept
        assert ks.KlineDataset(one_with_amount, window=16, symbols=["S000"]).fields[-1] == "amount"


def test_no_default_field_every_symbol_has_is_one_line(tmp_path):
    panel = bars(2, 50)
    panel[0, :, :5] = np.nan                     # symbol 0: amount only; symbol 1: no amount
    panel[1, :, 5] = np.nan
    path = make_store(tmp_path / "s", panel)
    with pytest.raises(InputError, match=r"none of the default fields \(open, high, low, close, volume, amount\) is "
                                         r"present for every symbol; pass fields=") as e, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ks.KlineDataset(path, window=5)
    assert "\n" not in str(e.value)


def test_real_files_of_two_vendors(real, tmp_path):
    """tushare's files have an amount column, Yahoo's do not: the default keeps every symbol."""
    import pandas as pd
    tushare = sorted((real / "tushare_daily").glob("*.csv"))
    yahoo = sorted((real / "us_yahoo_daily").glob("*.csv"))
    ks.ingest([real / "tushare_daily", real / "us_yahoo_daily"], tmp_path / "s")
    with_amount = sum(pd.read_csv(f)["amount"].notna().any() for f in tushare)
    n = len(tushare) + len(yahoo)
    with pytest.warns(RuntimeWarning) as rec:
        ds = ks.KlineDataset(tmp_path / "s", window=32, days="symbol")
    assert notes(rec) == [f"kline-store: {tmp_path / 's'}: amount: {with_amount} of {n} symbols; left out of the "
                          f"default fields (open, high, low, close, volume); pass fields=[...] to use it"]
    assert len(symbols_of(ds)) == n


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**32 - 1), st.floats(0, 1))
def test_has_fields_equals_a_brute_force_read(n_sym, n_dates, seed, holes):
    rng = np.random.default_rng(seed)
    panel = rng.normal(size=(n_sym, n_dates, 3)).astype(np.float32)
    panel[rng.random(panel.shape) < holes] = np.nan
    present = np.isfinite(panel).any(axis=2)
    first = np.array([np.flatnonzero(r)[0] if r.any() else -1 for r in present])
    last = np.array([np.flatnonzero(r)[-1] if r.any() else -1 for r in present])
    lo, hi = sorted(rng.integers(0, n_dates, 2).tolist())
    rows = rng.permutation(n_sym)[: rng.integers(1, n_sym + 1)]
    got = coverage.has_fields(panel, first, last, rows, [2, 0], lo, hi)
    want = [[bool(np.isfinite(panel[r, lo: hi + 1, f]).any()) for f in (2, 0)] for r in rows]
    assert got.tolist() == want


def test_many_fields_without_a_value_are_one_line(tmp_path):
    """A symbol with bars in range but no value of any input (out of a universe there, say) is one note, not one
    per field (158 lines for Alpha158)."""
    panel = bars(4, 120)
    panel[3, 60:, :] = np.nan
    panel[3, 60:, 3] = 1.0                       # its close (a bar) stays, every other field is missing
    path = make_store(tmp_path / "s", panel)
    with pytest.warns(RuntimeWarning) as rec:
        ds = ks.KlineDataset(path, window=8, start=str(ks.open_store(path).dates[80])[:10],
                             fields=["open", "high", "low", "volume", "amount"])
    assert symbols_of(ds) == {0, 1, 2}
    assert notes(rec) == [f"kline-store: {path}: 5 fields ('open', 'high', 'low', 'volume', ...) have no value in "
                          f"range for 1 of the 4 symbols with bars there: they have no window; leave them out of "
                          f"fields= to keep them"]
