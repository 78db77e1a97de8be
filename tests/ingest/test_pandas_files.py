"""Files written by pandas, read without flags: an unnamed index column of dates, float dates, odd column names.

Each file is made by pandas from real data, the way notebooks (and backtesting's GOOG.csv) make them, and
must give the store the original file gives.
"""

from __future__ import annotations

import numpy as np
import pytest

import kline_store as ks
from conftest import run_cli, write
from kline_store.ingest.columns import parse_mapping
from kline_store.errors import InputError

pd = pytest.importorskip("pandas")   # in the test extra


def same_store(a, b, fields=None) -> None:
    """Same calendar and, field by field, the same values (symbols named after different files)."""
    x, y = ks.open_store(a), ks.open_store(b)
    fields = fields or x.fields
    assert len(x.symbols) == len(y.symbols) and (x.dates == y.dates).all()
    for f in fields:
        np.testing.assert_array_equal(x.array(f), y.array(f))


@pytest.fixture
def goog(real):
    return real / "yahoo_mplfinance" / "yahoofinance-GOOG-20040819-20180120.csv"


def test_to_csv_index_of_dates_is_the_date_column(goog, tmp_path):
    df = pd.read_csv(goog, index_col=0, parse_dates=True)
    df.index.name = None                                  # backtesting's GOOG.csv: ",Open,High,Low,Close,Volume"
    p = tmp_path / "GOOG.csv"
    df[["Open", "High", "Low", "Close", "Volume"]].to_csv(p)
    assert p.read_text().startswith(",Open,High,Low,Close,Volume\n2004-08-19,")
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "a"))
    assert r.returncode == 0 and "3379 bars" in r.stdout, r.stderr
    ks.ingest([goog], tmp_path / "b")
    same_store(tmp_path / "a", tmp_path / "b", ["open", "high", "low", "close", "volume"])


def test_to_parquet_index_and_a_named_index(goog, tmp_path):
    df = pd.read_csv(goog, index_col=0, parse_dates=True)
    df.index.name = None
    df.to_parquet(tmp_path / "GOOG.parquet")             # the index becomes __index_level_0__
    (tmp_path / "named").mkdir()
    df.rename_axis("Date").to_csv(tmp_path / "named" / "GOOG.csv")
    ks.ingest([goog], tmp_path / "ref")
    for src, out in [(tmp_path / "GOOG.parquet", "p"), (tmp_path / "named" / "GOOG.csv", "n")]:
        ks.ingest([src], tmp_path / out)
        same_store(tmp_path / out, tmp_path / "ref")


def test_a_range_index_is_left_out(real, tmp_path):
    src = real / "tushare_daily" / "000001.SZ.csv"
    pd.read_csv(src).to_csv(tmp_path / "000001.SZ.csv")       # ",ts_code,trade_date,...": 0, 1, 2, ...
    rep = ks.ingest([tmp_path / "000001.SZ.csv"], tmp_path / "a")
    assert rep.dropped_columns == {} and "" not in ks.open_store(tmp_path / "a").fields
    ks.ingest([src], tmp_path / "b")
    same_store(tmp_path / "a", tmp_path / "b")


def test_integral_float_dates_parse_as_yyyymmdd(real, tmp_path):
    src = real / "tushare_daily" / "000001.SZ.csv"
    df = pd.read_csv(src)
    df.loc[len(df)] = [None] * len(df.columns)           # a NaN turns the int column into floats ...
    df = df.dropna(subset=["close"])                     # ... and stays so once the row is gone
    assert df["trade_date"].dtype == np.float64
    df.to_csv(tmp_path / "000001.SZ.csv", index=False)
    assert "20241231.0," in (tmp_path / "000001.SZ.csv").read_text()
    ks.ingest([tmp_path / "000001.SZ.csv"], tmp_path / "a")
    ks.ingest([src], tmp_path / "b")
    same_store(tmp_path / "a", tmp_path / "b")


def test_float_dates_that_are_not_whole_are_errors(tmp_path):
    p = write(tmp_path / "x.csv", "trade_date,close\n20240102.0,1\n20240103.5,2\n")
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "st"))
    assert r.returncode == 1 and "x.csv: line 3: unparseable date '20240103.5' in column 'trade_date'" in r.stderr


def test_map_takes_any_source_name(goog, tmp_path):
    df = pd.read_csv(goog).rename(columns={"Date": "", "Close": "Px Last (USD)", "Volume": "vol=shares"})
    df[["", "Open", "Px Last (USD)", "vol=shares"]].to_csv(tmp_path / "g.csv", index=False)
    r = run_cli("ingest", str(tmp_path / "g.csv"), "-o", str(tmp_path / "a"), "--map", "=date",
                "--map", "Px Last (USD)=close", "--map", "vol=shares=volume")
    assert r.returncode == 0, r.stderr
    ks.ingest([goog], tmp_path / "b")
    same_store(tmp_path / "a", tmp_path / "b", ["open", "close", "volume"])
    assert parse_mapping(["=date", "a=b=close", " Px =close"]) == {"": "date", "a=b": "close", " Px ": "close"}
    for bad in ["close", "px=", "px= "]:
        with pytest.raises(InputError, match="expected SOURCE=FIELD"):
            parse_mapping([bad])


def test_an_unnamed_first_column_without_dates_is_not_a_date(tmp_path):
    p = write(tmp_path / "x.csv", ",close\na,1\nb,2\n")
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "st"))
    assert r.returncode == 1 and "x.csv: no date column" in r.stderr
