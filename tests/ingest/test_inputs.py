"""Where input comes from: files, folders and globs, symbols in file names, and "line N" of a file."""

from pathlib import Path

import numpy as np
import pytest

from conftest import write
from kline_store.errors import InputError
from kline_store.ingest.inputs import expand_inputs, location, symbol_from_name


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


def test_file_names_with_glob_characters_are_read_as_names(tmp_path):
    """polars expands * and [ ] in a path: 'x*.csv' once also read xy.csv's bars into symbol x*, and 'a[1].csv'
    failed with 'expanded paths were empty'."""
    import polars as pl
    from kline_store import ingest, open_store
    folder = tmp_path / "in"
    write(folder / "x*.csv", "date,open,high,low,close\n2024-01-02,1,2,0.5,1.5\n")
    write(folder / "xy.csv", "date,open,high,low,close\n2024-01-03,9,9,9,9\n")
    write(folder / "a[1].csv", "date,open,high,low,close\n2024-01-04,2,2,2,2\n")
    pl.DataFrame({"date": ["2024-01-02"], "close": [1.0]}).write_parquet(folder / "p*.parquet")
    pl.DataFrame({"date": ["2024-01-05"], "close": [7.0]}).write_parquet(folder / "pq.parquet")
    rep = ingest([folder], tmp_path / "s")
    st = open_store(tmp_path / "s")
    assert rep.n_bars == 5 and sorted(st.symbols) == ["a[1]", "p*", "pq", "x*", "xy"]
    close = dict(zip(st.symbols, np.nansum(st.array("close"), axis=1)))
    assert close == {"a[1]": 2.0, "p*": 1.0, "pq": 7.0, "x*": 1.5, "xy": 9.0}


def test_symbol_patterns_that_find_nothing_or_are_not_patterns(tmp_path):
    """An empty symbol was once blamed on the target store's manifest; a bad pattern was an 'unexpected error'."""
    with pytest.raises(InputError, match=r"AAPL\.csv: --symbol-pattern 'AAPL\(\.\*\)' finds an empty symbol"):
        symbol_from_name(Path("AAPL.csv"), "AAPL(.*)")
    with pytest.raises(InputError, match=r"\.csv: no symbol in the file name"):
        symbol_from_name(Path(".csv"))
    for bad in ("(", "a{99999999999}"):
        with pytest.raises(InputError, match=r"--symbol-pattern .*: not a regular expression"):
            symbol_from_name(Path("AAPL.csv"), bad)


def test_an_address_space_limit_polars_would_abort_under_is_one_line(tmp_path):
    """Issue 19: under `ulimit -v` polars aborted with a Rust backtrace and left the store's `.lock` behind."""
    import subprocess
    import sys
    csv = tmp_path / "a.csv"
    csv.write_text("date,close\n2024-01-02,1\n")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, resource.RLIM_INFINITY)); "
            "from kline_store.cli.main import main; sys.argv = ['kline-store', 'ingest', sys.argv[1], '-o', sys.argv[2]]; "
            "main()")
    r = subprocess.run([sys.executable, "-c", code, str(csv), str(tmp_path / "s")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "address-space limit (ulimit -v) is 1024 MiB" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "s").exists()
