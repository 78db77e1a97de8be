"""Folders of mixed files (--skip-bad, --exclude), compressed CSVs read directly, --na markers, on real files."""

from __future__ import annotations

import gzip
import shutil
import zipfile

import numpy as np
import pyarrow as pa
import pytest

from conftest import run_cli, write
from kline_store import ingest, open_store
from kline_store.errors import InputError

MIN = "intraday_ashare_1min/000001.XSHG_1MIN.csv"


@pytest.fixture()
def mixed(real, tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    for s in ("AAPL", "MSFT"):
        shutil.copy(real / "us_yahoo_daily" / f"{s}.csv", d)
    write(d / "AAPL_ticks.csv", "time,price,size\n2020-01-02 09:30:00.123,10.5,100\n2020-01-02 09:30:01,10.6,200\n")
    write(d / "EURUSD_quotes.csv", "timestamp,bid,ask\n2020-01-02 09:30:00,1.1,1.2\n")
    return d


def test_a_tick_file_stops_a_folder_with_a_hint(mixed, tmp_path):
    r = run_cli("ingest", str(mixed), "-o", str(tmp_path / "s"))
    assert r.returncode == 1 and "AAPL_ticks.csv: ticks (one price per trade), not bars" in r.stderr
    assert "--skip-bad" in r.stderr


def test_skip_bad_ingests_the_bars_and_lists_the_rest(mixed, real, tmp_path):
    r = run_cli("ingest", str(mixed), "-o", str(tmp_path / "s"), "--skip-bad")
    assert r.returncode == 0, r.stderr
    assert "skipped 2 file(s) that are not bars" in r.stdout
    assert "EURUSD_quotes.csv: bid/ask quotes, not bars" in r.stdout
    ingest([real / "us_yahoo_daily" / f"{s}.csv" for s in ("AAPL", "MSFT")], tmp_path / "ref")
    a, b = open_store(tmp_path / "s"), open_store(tmp_path / "ref")
    assert a.symbols == b.symbols == ["AAPL", "MSFT"]
    np.testing.assert_array_equal(a.panel, b.panel)
    assert [s["path"].rsplit("/", 1)[-1] for s in a.manifest["sources"]] == ["AAPL.csv", "MSFT.csv"]


def test_exclude_globs(mixed, tmp_path):
    r = run_cli("ingest", str(mixed), "-o", str(tmp_path / "s"), "--exclude", "*_ticks.csv", "--exclude", "*quotes*")
    assert r.returncode == 0, r.stderr
    assert open_store(tmp_path / "s").symbols == ["AAPL", "MSFT"]
    with pytest.raises(InputError, match="excludes every input file"):
        ingest([mixed], tmp_path / "t", exclude=["*.csv"])


@pytest.mark.parametrize("how", ["gz", "zst", "zip"])
def test_compressed_csv_is_read_directly(real, tmp_path, how):
    raw = (real / MIN).read_bytes()
    if how == "gz":
        f = tmp_path / "000001.XSHG.csv.gz"
        f.write_bytes(gzip.compress(raw))
    elif how == "zst":
        f = tmp_path / "000001.XSHG.csv.zst"
        with pa.output_stream(str(f), compression="zstd") as out:
            out.write(raw)
    else:
        f = tmp_path / "000001.XSHG.zip"
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("000001.XSHG_1MIN.csv", raw)
    ingest([f], tmp_path / "s")
    ingest([real / MIN], tmp_path / "ref")
    a, b = open_store(tmp_path / "s"), open_store(tmp_path / "ref")
    assert a.freq == "1min" and np.array_equal(a.dates, b.dates)
    np.testing.assert_array_equal(a.panel, b.panel)


def test_zip_of_several_files_and_a_bad_line_inside_a_gz(tmp_path):
    z = tmp_path / "two.zip"
    with zipfile.ZipFile(z, "w") as zz:
        zz.writestr("a.csv", "date,close\n2020-01-02,1\n")
        zz.writestr("b.csv", "date,close\n2020-01-02,1\n")
    with pytest.raises(InputError, match="a zip archive is read when it holds one CSV file; it holds a.csv, b.csv"):
        ingest([z], tmp_path / "s")
    g = tmp_path / "x.csv.gz"
    g.write_bytes(gzip.compress(b"date,close\n2020-01-02,1\n2020-01-03,abc\n"))
    with pytest.raises(InputError, match=r"x.csv.gz: line 3: column 'close': non-numeric value 'abc'"):
        ingest([g], tmp_path / "s")


def test_na_markers(tmp_path):
    f = write(tmp_path / "DGS10.csv", "DATE,DGS10\n2020-01-01,.\n2020-01-02,1.88\n2020-01-03,#N/A\n2020-01-06,1.81\n")
    with pytest.raises(InputError, match=r"line 2: column 'DGS10': non-numeric value '\.' \(a missing-value marker\? "
                                         r"pass --na '\.'\)"):
        ingest([f], tmp_path / "s", map=["DGS10=close"])
    r = run_cli("ingest", str(f), "-o", str(tmp_path / "s"), "--map", "DGS10=close", "--na", ".", "--na", "#N/A")
    assert r.returncode == 0, r.stderr
    st = open_store(tmp_path / "s")
    assert [str(d) for d in st.dates] == ["2020-01-02", "2020-01-06"]
    np.testing.assert_array_equal(st.array("close")[0], np.float32([1.88, 1.81]))
