"""The first hour's papercuts: help text, usage errors, info --symbols, exports into new folders and whole
numbers in CSV, header hints, plurals, an append that adds a symbol by its file name."""

from __future__ import annotations

import json
import shutil

import polars as pl

from conftest import run_cli, write
from kline_store import ingest, open_store


def test_help_is_not_daily_only_and_bad_freq_is_a_usage_error(tmp_path):
    r = run_cli("--help")
    assert "Daily K-line" not in r.stdout and "weekly, monthly or intraday" in r.stdout
    f = write(tmp_path / "a.csv", "date,close\n2020-01-02,1\n")
    r = run_cli("ingest", str(f), "-o", str(tmp_path / "s"), "--freq", "1x")
    assert r.returncode == 2 and "Invalid value for '--freq'" in r.stderr


def test_info_symbols_and_plural(real, tmp_path):
    ingest([real / "us_yahoo_daily" / "AAPL.csv"], tmp_path / "one")
    r = run_cli("ingest", str(real / "us_yahoo_daily" / "AAPL.csv"), "-o", str(tmp_path / "two"))
    assert "1 symbol, 1258 dates" in r.stdout
    r = run_cli("info", str(tmp_path / "one"))
    assert "1 symbol x 1258 dates" in r.stdout
    r = run_cli("info", str(tmp_path / "one"), "--symbols")
    assert r.stdout.split("\n")[1].split() == ["AAPL", "2012-09-04", "2017-09-01", "1258"]
    r = run_cli("info", str(tmp_path / "one"), "--symbols", "--json")
    assert json.loads(r.stdout)["per_symbol"] == [{"symbol": "AAPL", "first": "2012-09-04", "last": "2017-09-01",
                                                   "bars": 1258}]


def test_export_into_a_new_nested_folder_with_whole_volumes(real, tmp_path):
    ingest([real / "us_yahoo_daily" / "AAPL.csv"], tmp_path / "s")
    out = tmp_path / "a" / "b" / "bars.csv"
    r = run_cli("export", str(tmp_path / "s"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    first = out.read_text().split("\n")[1]
    assert ",91973000," in first and "91973000.0" not in first
    r = run_cli("export", str(tmp_path / "s"), "--format", "qlib", "-o", str(tmp_path / "q" / "r" / "provider"))
    assert r.returncode == 0 and (tmp_path / "q" / "r" / "provider" / "calendars" / "day.txt").is_file(), r.stderr
    ingest([out], tmp_path / "back")
    a, b = open_store(tmp_path / "s"), open_store(tmp_path / "back")
    assert (a.panel[~(a.panel != a.panel)] == b.panel[~(b.panel != b.panel)]).all()


def test_header_with_fewer_names_than_fields(tmp_path):
    f = write(tmp_path / "x.csv", "date,close\n2020-01-02,1,5\n2020-01-03,2,6\n")
    r = run_cli("ingest", str(f), "-o", str(tmp_path / "s"))
    assert "the header names fewer columns than the lines hold" in r.stderr and "thousands" not in r.stderr


def test_append_of_a_renamed_file_says_it_adds_a_symbol(real, tmp_path):
    src = real / "us_yahoo_daily" / "AAPL.csv"
    lines = src.read_text().splitlines()
    old, new = tmp_path / "aapl-2012-2016.csv", tmp_path / "aapl-2012-2017.csv"
    write(old, "\n".join(lines[:1000]) + "\n")
    shutil.copy(src, new)
    ingest([old], tmp_path / "s")
    r = run_cli("append", str(tmp_path / "s"), str(new))
    assert "new symbols: 1 (aapl-2012-2017), named after the input file name(s)" in r.stdout and "--symbol" in r.stdout
    r = run_cli("ingest", str(old), "-o", str(tmp_path / "t"))
    r = run_cli("append", str(tmp_path / "t"), str(new), "--symbol", "aapl-2012-2016")
    assert r.returncode == 0, r.stderr
    st = open_store(tmp_path / "t")
    assert st.symbols == ["aapl-2012-2016"] and st.n_dates == 1258
    assert pl.read_csv(new)["Close"].cast(pl.Float32).to_list() == st.array("close")[0].tolist()
