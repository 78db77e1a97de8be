"""DataFrames in (ks.ingest / ks.append of pandas and polars frames) and out (Store.to_polars / to_pandas,
export --symbols/--start/--end), on real Yahoo files: frames out equal the store, frames in equal a file ingest."""

from __future__ import annotations

import numpy as np
import pandas as pd
import polars as pl
import pytest

from conftest import run_cli
from kline_store import append, ingest, open_store
from kline_store.errors import InputError

SYMS = ("AAPL", "MSFT", "GOOG")


@pytest.fixture(scope="module")
def files(real):
    return [real / "us_yahoo_daily" / f"{s}.csv" for s in SYMS]


@pytest.fixture(scope="module")
def ref(files, tmp_path_factory):
    path = tmp_path_factory.mktemp("frames") / "ref"
    ingest(files, path)
    return open_store(path)


def _long(files) -> pd.DataFrame:
    return pd.concat([pd.read_csv(f).assign(Symbol=f.stem) for f in files], ignore_index=True)


def _equal(a, b):
    assert a.symbols == b.symbols and a.fields == b.fields and np.array_equal(a.dates, b.dates)
    np.testing.assert_array_equal(a.panel, b.panel)


def test_pandas_long_frame_equals_the_files(tmp_path, files, ref):
    ingest(_long(files), tmp_path / "s")
    st = open_store(tmp_path / "s")
    _equal(st, ref)
    assert st.manifest["sources"][0]["path"] == "DataFrame"


def test_polars_long_frame_and_one_symbol_indexed_by_date(tmp_path, files, ref):
    ingest(pl.from_pandas(_long(files)), tmp_path / "p")
    _equal(open_store(tmp_path / "p"), ref)
    one = pd.read_csv(files[0], index_col="Date", parse_dates=True)
    ingest(one, tmp_path / "one", symbol="AAPL")
    st = open_store(tmp_path / "one")
    assert st.symbols == ["AAPL"]
    np.testing.assert_array_equal(st.array("close")[0], ref.to_polars(symbols="AAPL")["close"].to_numpy())


def test_append_a_frame_equals_a_full_ingest(tmp_path, files, ref):
    df = _long(files)
    cut = pd.to_datetime(df["Date"]) <= "2015-06-30"
    ingest(df[cut], tmp_path / "s")
    append(tmp_path / "s", pl.from_pandas(df[~cut].reset_index(drop=True)))
    _equal(open_store(tmp_path / "s"), ref)


def test_frame_messages_name_rows_and_arguments_are_one_line(tmp_path, files):
    df = _long(files)
    df.loc[3, "Close"] = np.inf
    with pytest.raises(InputError, match=r"^DataFrame: row 4: column 'close': infinite value$"):
        ingest(df, tmp_path / "s")
    with pytest.raises(InputError, match="no symbol column.*symbol='NAME'"):
        ingest(pd.read_csv(files[0]), tmp_path / "s")
    with pytest.raises(InputError, match=r"^out=a pandas.DataFrame: expected a store directory path"):
        ingest("x.csv", df)   # arguments swapped
    with pytest.raises(InputError, match=r"^inputs=42: expected a path"):
        ingest(42, tmp_path / "s")


def test_to_polars_equals_the_store(ref):
    df = ref.to_polars()
    assert df.columns == ["symbol", "date", *ref.fields] and df.height == ref.manifest["n_bars"]
    for i, s in enumerate(ref.symbols):
        part = df.filter(pl.col("symbol") == s)
        rows = np.searchsorted(ref.dates, part["date"].to_numpy().astype("datetime64[D]"))
        np.testing.assert_array_equal(part["close"].to_numpy(), ref.array("close")[i, rows])
    sel = ref.to_polars(symbols=["MSFT"], start="2013", end="2013-03", fields=["close"])
    assert sel.columns == ["symbol", "date", "close"] and set(sel["symbol"]) == {"MSFT"}
    assert str(sel["date"].min()) == "2013-01-02" and str(sel["date"].max()) == "2013-03-28"
    with pytest.raises(InputError, match="no symbol 'NOPE'"):
        ref.to_polars(symbols=["NOPE"])


def test_to_pandas_long_and_wide(ref):
    long = ref.to_pandas(end="2012")
    assert long["date"].max() == pd.Timestamp("2012-12-31")
    wide = ref.to_pandas(fields="close", wide=True)
    assert list(wide.columns) == ref.symbols and len(wide) == ref.n_dates
    np.testing.assert_array_equal(wide.to_numpy().T, ref.array("close"))
    with pytest.raises(InputError, match="one field"):
        ref.to_pandas(wide=True)


def test_export_a_selection_and_symbol_option(tmp_path, files, ref):
    out = tmp_path / "sel.parquet"
    r = run_cli("export", str(ref.path), "-o", str(out), "--symbols", "AAPL,GOOG", "--start", "2014", "--end", "2014")
    assert r.returncode == 0, r.stderr
    got = pl.read_parquet(out)
    assert sorted(set(got["symbol"])) == ["AAPL", "GOOG"] and got["date"].dt.year().unique().to_list() == [2014]
    assert got.equals(ref.to_polars(symbols=["AAPL", "GOOG"], start="2014", end="2014"))
    r = run_cli("ingest", str(files[0]), "-o", str(tmp_path / "x"), "--symbol", "APPLE")
    assert r.returncode == 0, r.stderr
    assert open_store(tmp_path / "x").symbols == ["APPLE"]
    r = run_cli("ingest", *map(str, files), "-o", str(tmp_path / "y"), "--symbol", "APPLE")
    assert r.returncode == 1 and "names the symbol of one input; 3 files given" in r.stderr
