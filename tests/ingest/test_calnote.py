"""Ingest reports the dates that only a few symbols trade (a European index among US stocks) and the windows
they cost, checked against the datasets' own counts on real US files."""

from __future__ import annotations

import re

import polars as pl
import pytest

from conftest import run_cli
from kline_store import KlineDataset, ingest

US = ("AAPL", "MSFT", "ORCL", "INTC")
EU_ONLY = ["2013-07-04", "2013-11-28", "2014-01-20", "2014-02-17", "2014-05-26", "2014-07-04", "2014-09-01"]


@pytest.fixture(scope="module")
def inputs(real, tmp_path_factory):
    d = tmp_path_factory.mktemp("calnote")
    files = [real / "us_yahoo_daily" / f"{s}.csv" for s in US]
    src = pl.read_csv(files[0])
    extra = pl.DataFrame({"Date": EU_ONLY}).join(src.drop("Date").head(len(EU_ONLY)).with_row_index("i"),
                                                 how="cross").filter(pl.col("i") == 0).drop("i")
    eu = pl.concat([src, extra.select(src.columns)]).sort("Date")
    eu.write_csv(d / "STOXX50E.csv")
    return files, d / "STOXX50E.csv"


def test_foreign_dates_are_reported_with_their_cost(inputs, tmp_path):
    files, eu = inputs
    r = run_cli("ingest", *map(str, files), str(eu), "-o", str(tmp_path / "mix"))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("note calendar:"))
    assert line.startswith("note calendar: 7 date(s) traded by fewer than half of the symbols listed then "
                           "(2013-07-04, 2013-11-28, 2014-01-20, ...) are NaN days for 4 symbol(s)")
    assert "days='symbol'" in line and "--calendar" in line
    ingest(files, tmp_path / "us")
    lost = 0
    for s in US:
        with_eu = len(KlineDataset(tmp_path / "mix", window=64, symbols=[s]))
        without = len(KlineDataset(tmp_path / "us", window=64, symbols=[s]))
        lost += without - with_eu
        if s == "ORCL":
            orcl = (without - with_eu, without)
    m = re.search(r"with window=64: ([\d,]+) of [\d,]+ windows lost, (\w+) ([\d,]+) of ([\d,]+)", line)
    assert int(m.group(1).replace(",", "")) == lost > 0
    worst = m.group(2)
    assert worst in US
    if worst == "ORCL":
        assert (int(m.group(3).replace(",", "")), int(m.group(4).replace(",", ""))) == orcl
    full = KlineDataset(tmp_path / "mix", window=64, days="symbol", symbols=["ORCL"])   # the way out
    assert len(full) >= orcl[1]


def test_no_note_for_one_market(inputs, tmp_path):
    files, _ = inputs
    rep = ingest(files, tmp_path / "us")
    assert rep.notes == [] and not any(ln.startswith("note") for ln in rep.lines())


def test_one_of_two_symbols_trading_a_date_is_noted(inputs, tmp_path):
    files, eu = inputs
    rep = ingest([files[0], eu], tmp_path / "two")
    line = next(n for n in rep.notes if n.startswith("calendar:"))
    assert line.startswith("calendar: 7 date(s) traded by one of the two symbols listed then (2013-07-04, ")
    assert "NaN days for 1 symbol(s)" in line
