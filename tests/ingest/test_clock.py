"""Date and time in two columns (backtrader, MetaTrader, tushare minute files) read as one stamp, on the real
A-share minute file split into date and time columns: every value checked against a direct ingest."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from conftest import run_cli, write
from kline_store import ingest, open_store
from kline_store.errors import InputError

MIN = "intraday_ashare_1min/000001.XSHG_1MIN.csv"


@pytest.fixture(scope="module")
def reference(real, tmp_path_factory):
    path = tmp_path_factory.mktemp("clock") / "ref"
    ingest([real / MIN], path)
    return open_store(path)


@pytest.fixture(scope="module")
def source(real):
    return pl.read_csv(real / MIN)


def _same(st, ref):
    assert st.freq == "1min" and np.array_equal(st.dates, ref.dates)
    for f in ("open", "high", "low", "close"):
        if f in st.fields:
            np.testing.assert_array_equal(st.array(f), ref.array(f))


def _split(source: pl.DataFrame, date: str, time: str, date_fmt: str = "%Y-%m-%d", time_fmt: str = "%H:%M:%S"):
    stamp = pl.col("dt").str.to_datetime("%Y-%m-%d %H:%M:%S")
    return source.select(stamp.dt.strftime(date_fmt).alias(date), stamp.dt.strftime(time_fmt).alias(time),
                         "open", "high", "low", "close", "vol")


@pytest.mark.parametrize("date,time,date_fmt,time_fmt", [
    ("Date", "Time", "%Y-%m-%d", "%H:%M:%S"),          # backtrader
    ("<DATE>", "<TIME>", "%Y.%m.%d", "%H:%M"),        # MetaTrader 5 export
    ("<DATE>", "<TIME>", "%Y%m%d", "%H%M%S"),         # MetaTrader 4 / Finam digits
    ("trade_date", "trade_time", "%Y%m%d", "%H:%M:%S"),
])
def test_date_and_time_columns_are_one_stamp(tmp_path, source, reference, date, time, date_fmt, time_fmt):
    f = tmp_path / "000001.XSHG.csv"
    _split(source, date, time, date_fmt, time_fmt).write_csv(f)
    st = (ingest([f], tmp_path / "s"), open_store(tmp_path / "s"))[1]
    _same(st, reference)


def test_integer_hhmmss_without_leading_zero_and_parquet_time(tmp_path, source, reference):
    df = _split(source, "Date", "Time", "%Y%m%d", "%H%M%S").with_columns(pl.col("Date").cast(pl.Int64),
                                                                          pl.col("Time").cast(pl.Int64))
    assert df["Time"][0] == 93100
    df.write_parquet(tmp_path / "a.parquet")
    _same((ingest([tmp_path / "a.parquet"], tmp_path / "s1"), open_store(tmp_path / "s1"))[1], reference)
    df2 = _split(source, "Date", "Time").with_columns(pl.col("Date").str.to_date(), pl.col("Time").str.to_time())
    df2.write_parquet(tmp_path / "b.parquet")
    _same((ingest([tmp_path / "b.parquet"], tmp_path / "s2"), open_store(tmp_path / "s2"))[1], reference)


def test_tushare_trade_time_holding_the_whole_stamp(tmp_path, source, reference):
    df = source.select(pl.col("dt").str.slice(0, 10).str.replace_all("-", "").alias("trade_date"),
                       pl.col("dt").alias("trade_time"), "open", "high", "low", "close", "vol")
    df.write_csv(tmp_path / "x.csv")
    _same((ingest([tmp_path / "x.csv"], tmp_path / "s"), open_store(tmp_path / "s"))[1], reference)


def test_map_col_time_for_other_names(tmp_path, source, reference):
    df = _split(source, "Day", "Clock")
    df.write_csv(tmp_path / "x.csv")
    r = run_cli("ingest", str(tmp_path / "x.csv"), "-o", str(tmp_path / "s"), "--map", "Clock=time")
    assert r.returncode == 0, r.stderr
    _same(open_store(tmp_path / "s"), reference)


def test_bad_time_names_its_line(tmp_path):
    f = write(tmp_path / "x.csv", "Date,Time,Close\n2020-01-02,09:31,1\n2020-01-02,09:72,2\n")
    with pytest.raises(InputError, match=r"x.csv: line 3: column 'Time': not a time of day '09:72'"):
        ingest([f], tmp_path / "s")


def test_daily_file_with_a_time_column_only_is_still_read(tmp_path):
    f = write(tmp_path / "x.csv", "time,close\n2020-01-02,1\n2020-01-03,2\n")
    st = (ingest([f], tmp_path / "s"), open_store(tmp_path / "s"))[1]
    assert st.freq == "1d" and st.n_dates == 2
