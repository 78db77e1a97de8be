"""Where input comes from: files, folders and globs, symbols in file names, and "line N" of a file."""

from pathlib import Path

import pytest

from conftest import write
from kline_store.errors import InputError
from kline_store.inputs import expand_inputs, location, symbol_from_name


def test_expand_inputs(tmp_path):
    write(tmp_path / "a" / "x.csv", "date,close\n2024-01-02,1\n")
    write(tmp_path / "a" / "y.parquet.txt.bak", "junk")
    write(tmp_path / "b.csv", "date,close\n2024-01-02,1\n")
    assert [p.name for p in expand_inputs([tmp_path / "a", str(tmp_path / "*.csv")])] == ["x.csv", "b.csv"]
    assert [p.name for p in expand_inputs([str(tmp_path / "[a]")])] == ["x.csv"]   # a glob matching a folder
    assert [p.name for p in expand_inputs([tmp_path / "b.csv", tmp_path / "." / "b.csv"])] == ["b.csv"]
    with pytest.raises(InputError, match="no such file"):
        expand_inputs([tmp_path / "missing.csv"])
    with pytest.raises(InputError, match="matches no file"):
        expand_inputs([str(tmp_path / "*.parquet")])
    with pytest.raises(InputError, match="no input given"):
        expand_inputs([])


def test_location_is_the_files_own_numbering():
    assert location(Path("a.csv"), 0) == "line 2"          # the header is line 1
    assert location(Path("a.PARQUET"), 0) == "row 1"


def test_symbol_from_name():
    assert symbol_from_name(Path("000001.SZ.csv")) == "000001.SZ"
    assert symbol_from_name(Path("IBM.CSV")) == "IBM"
    assert symbol_from_name(Path("yahoofinance-SPY-2008.csv"), r"yahoofinance-(\w+)-") == "SPY"
    with pytest.raises(InputError, match="does not match the file name"):
        symbol_from_name(Path("x.csv"), "zzz")
