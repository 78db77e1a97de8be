"""Weekly and monthly bars: detected from the dates of real files (pandas' weekly and monthly resampling of a
real daily file), stated with --freq, kept apart from daily bars, and made by `resample --freq 1w|1mo` equal to
pandas' resampling of the same stored bars."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli
from kline_store import KlineDataset, append, ingest, open_store
from kline_store.errors import InputError
from kline_store.ingest.resample import resample

AGG = {"Open": "first", "High": "max", "Low": "min", "Close": "last", "Volume": "sum"}


@pytest.fixture(scope="module")
def daily_file(real):
    return real / "us_yahoo_daily" / "AAPL.csv"


@pytest.fixture(scope="module")
def files(daily_file, tmp_path_factory):
    d = tmp_path_factory.mktemp("barsize")
    df = pd.read_csv(daily_file, index_col="Date", parse_dates=True)
    df.resample("W-FRI").agg(AGG).dropna().to_csv(d / "AAPL_W.csv")
    df.resample("ME").agg(AGG).dropna().to_csv(d / "AAPL_M.csv")
    return d


@pytest.mark.parametrize("name,bar", [("AAPL_W.csv", "1w"), ("AAPL_M.csv", "1mo")])
def test_weekly_and_monthly_files_are_detected_and_stored_exactly(files, tmp_path, name, bar):
    ingest([files / name], tmp_path / "s")
    st = open_store(tmp_path / "s")
    src = pd.read_csv(files / name, parse_dates=["Date"])
    assert st.bar == bar and st.info()["bar"] == bar and st.freq == "1d"
    assert np.array_equal(st.dates, src["Date"].to_numpy().astype("datetime64[D]"))
    for f, c in (("open", "Open"), ("high", "High"), ("low", "Low"), ("close", "Close"), ("volume", "Volume")):
        np.testing.assert_array_equal(st.array(f)[0], src[c].to_numpy().astype(np.float32))
    r = run_cli("info", str(tmp_path / "s"))
    assert f"freq     {bar}" in r.stdout
    ds = KlineDataset(tmp_path / "s", window=4, horizon=1)   # the label is the next bar: next week or month
    assert int(ds.label_days([0])[0]) == int(ds.locate([0])[1][0]) + 1


def test_stated_freq_and_mixed_sizes_are_one_line(files, daily_file, tmp_path):
    r = run_cli("ingest", str(files / "AAPL_W.csv"), "-o", str(tmp_path / "a"), "--freq", "1w")
    assert r.returncode == 0, r.stderr
    with pytest.raises(InputError, match=r"--freq 1mo: the dates of .*AAPL_W.csv are weekly bars \(1w\)"):
        ingest([files / "AAPL_W.csv"], tmp_path / "b", freq="1mo")
    with pytest.raises(InputError, match=r"AAPL.csv holds daily bars \(1d\) and .*AAPL_W.csv weekly bars \(1w\): "
                                         r"a store has one bar size"):
        ingest([files / "AAPL_W.csv", daily_file], tmp_path / "c")
    ingest([daily_file], tmp_path / "d")
    with pytest.raises(InputError, match=r"AAPL_M.csv holds monthly bars \(1mo\); .* is a store of daily bars \(1d\)"):
        append(tmp_path / "d", [files / "AAPL_M.csv"])


@pytest.mark.parametrize("bar,rule", [("1w", "W-SUN"), ("1mo", "M")])
def test_resample_to_weeks_and_months_equals_pandas(real, tmp_path, bar, rule):
    syms = ("AAPL", "MSFT", "PTR")   # PTR has a null row: a missing day inside a week
    ingest([real / "us_yahoo_daily" / f"{s}.csv" for s in syms], tmp_path / "d")
    rep = resample(tmp_path / "d", tmp_path / "w", bar)
    assert rep.freq == bar
    d, w = open_store(tmp_path / "d"), open_store(tmp_path / "w")
    assert w.bar == bar and w.symbols == d.symbols
    long = d.to_pandas()
    long["date"] = pd.to_datetime(long["date"])
    cal = pd.Series(pd.to_datetime(d.dates.astype("datetime64[ns]")))
    label = cal.groupby(cal.dt.to_period(rule)).max()         # a period ends on its last trading day
    assert np.array_equal(w.dates.astype("datetime64[D]"), label.to_numpy().astype("datetime64[D]"))
    agg = {"open": "first", "high": "max", "low": "min", "close": "last", "volume": "sum", "adj_close": "last",
           "adj_factor": "last"}
    for i, s in enumerate(w.symbols):
        one = long[long["symbol"] == s].set_index("date")[list(agg)].astype("float64")
        want = one.groupby(one.index.to_period(rule)).agg(agg)
        at = np.searchsorted(label.index, want.index)
        for f in agg:
            np.testing.assert_array_equal(w.array(f)[i, at], want[f].to_numpy().astype(np.float32), err_msg=f"{s} {f}")
        missing = np.setdiff1d(np.arange(w.n_dates), at)
        assert np.isnan(w.array("close")[i, missing]).all()
    r = run_cli("resample", str(tmp_path / "w"), "-o", str(tmp_path / "x"), "--freq", bar)
    assert r.returncode == 1 and f"not coarser than the store's {bar} bars" in r.stderr


def test_a_thinly_traded_daily_file_stays_daily(tmp_path):
    from conftest import write
    rows = ["2020-01-06", "2020-01-09", "2020-01-20", "2020-01-31", "2020-02-10", "2020-02-11", "2020-02-24"]
    f = write(tmp_path / "THIN.csv", "date,close\n" + "".join(f"{d},{i + 1}\n" for i, d in enumerate(rows)))
    ingest([f], tmp_path / "s")
    assert open_store(tmp_path / "s").bar == "1d"   # median gap 10 days, but two bars in one week
