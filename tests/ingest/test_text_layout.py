"""The files users have (issue 25 part 3, the reading options): --date-format (FX hours with fractions, DD-Mon-YY,
Mon D YYYY, a 12-hour HH-AM clock) recorded for appends; a first line that is no header skipped and reported,
--skip-rows N; --no-header --columns on a tab file; the separator detected among , ; tab |. Every accepted value
equals float32 of an independent pandas read; every refusal is one line, exit 1, the store unchanged."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli, write
from kline_store import append, ingest, open_store
from kline_store.errors import InputError

FX = """Gmt time,Open,High,Low,Close,Volume
01.01.2017 22:00:00.000,1.05155,1.05213,1.05130,1.05150,1200.5
01.01.2017 23:00:00.000,1.05150,1.05300,1.05100,1.05200,900.25
02.01.2017 00:00:00.000,1.05200,1.05250,1.05180,1.05190,700
02.01.2017 01:00:00.000,1.05190,1.05260,1.05170,1.05230,650.75
"""
MON_YY = """Date,Open,High,Low,Close,Volume
19-Sep-03,29.76,29.97,29.52,29.96,92433800
22-Sep-03,29.7,29.86,29.34,29.47,56963500
23-Sep-03,29.47,29.59,29.21,29.55,59301000
1-Oct-03,28.24,28.9,28.12,28.87,71245200
"""
MON_D_YYYY = """# Data source: https://example.com/quotes (charting library sample)
Date,Open,High,Low,Close,Volume
Jan 3 2000,1469.25,1478,1438.36,1455.22,931800000
Jan 4 2000,1455.22,1455.22,1397.43,1399.42,1009000000
Jan 10 2000,1441.47,1464.36,1441.47,1457.6,1064800000
"""
CRYPTO_12H = """Timestamps are UTC timezone,https://www.CryptoDataDownload.com
Date,Symbol,Open,High,Low,Close,Volume BTC,Volume USD
2019-10-17 01-PM,BTCUSD,8010.5,8060,8001,8050.25,15.25,122766.31
2019-10-17 12-PM,BTCUSD,8000,8050,7990,8010.5,12.5,100125.62
2019-10-17 11-AM,BTCUSD,7990,8005,7980,8000,10,80000
2019-10-17 10-AM,BTCUSD,7985,7995,7970,7990,8.125,64918.75
"""
TAB = ("2020-01-02\t7.5\t7.75\t7.25\t7.625\t1200\n2020-01-03\t7.625\t7.875\t7.5\t7.75\t900\n"
       "2020-01-06\t7.75\t8.125\t7.7\t8.0\t1500\n")


def _digest(folder) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def _equals_pandas(store, frame: pd.DataFrame, stamps: pd.Series, fields: dict[str, str]) -> None:
    """Each stored value equals float32 of pandas' value of the same bar (aligned by stamp)."""
    st = open_store(store)
    at = pd.DatetimeIndex(st.dates.astype("datetime64[ns]")).get_indexer(pd.DatetimeIndex(stamps))
    assert (at >= 0).all() and len(set(at)) == len(frame)
    for field, col in fields.items():
        want = frame[col].to_numpy(dtype=np.float64).astype(np.float32)
        np.testing.assert_array_equal(st.array(field)[0][at], want, err_msg=field)
    assert np.count_nonzero(np.isfinite(st.array("close")[0])) == len(frame)


OHLCV = {"open": "Open", "high": "High", "low": "Low", "close": "Close", "volume": "Volume"}


def test_fx_hours_with_fractions(tmp_path):
    f = write(tmp_path / "EURUSD.csv", FX)
    ingest([f], tmp_path / "s", date_format="%d.%m.%Y %H:%M:%S%.f", map=["Gmt time=date"])
    df = pd.read_csv(f)
    _equals_pandas(tmp_path / "s", df, pd.to_datetime(df["Gmt time"], format="%d.%m.%Y %H:%M:%S.%f"), OHLCV)
    assert open_store(tmp_path / "s").manifest["date_format"] == "%d.%m.%Y %H:%M:%S%.f"


def test_two_digit_years_and_month_names_then_an_append_reuses_the_format(tmp_path):
    f = write(tmp_path / "MSFT.csv", MON_YY)
    r = run_cli("ingest", str(f), "-o", str(tmp_path / "no"))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "'19-Sep-03'" in r.stderr and "--date-format" in r.stderr and "'%d-%b-%y'" in r.stderr
    assert "outside 1800" not in r.stderr and not (tmp_path / "no").exists()
    lines = MON_YY.splitlines()
    head = write(tmp_path / "a" / "MSFT.csv", "\n".join(lines[:3]) + "\n")
    tail = write(tmp_path / "b" / "MSFT.csv", "\n".join(lines[:1] + lines[3:]) + "\n")
    r = run_cli("ingest", str(head), "-o", str(tmp_path / "s"), "--date-format", "%d-%b-%y", "-q")
    assert r.returncode == 0, r.stderr
    append(tmp_path / "s", [tail])                 # no --date-format: the store's
    df = pd.read_csv(f)
    _equals_pandas(tmp_path / "s", df, pd.to_datetime(df["Date"], format="%d-%b-%y"), OHLCV)
    # A file of another form is refused in one line, the store unchanged.
    before = _digest(tmp_path / "s")
    other = write(tmp_path / "c" / "MSFT.csv", "Date,Open,High,Low,Close,Volume\n2003-10-02,1,2,0.5,1.5,10\n")
    r = run_cli("append", str(tmp_path / "s"), str(other))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "line 2: date '2003-10-02' in column 'Date' does not match --date-format '%d-%b-%y'" in r.stderr
    assert "the store's" in r.stderr and _digest(tmp_path / "s") == before


def test_a_comment_line_before_the_header_is_skipped_and_reported(tmp_path):
    f = write(tmp_path / "SPX.csv", MON_D_YYYY)
    rep = ingest([f], tmp_path / "s", date_format="%b %d %Y")
    assert any("skipped line 1 '# Data source" in n for n in rep.notes)
    df = pd.read_csv(f, skiprows=1)
    _equals_pandas(tmp_path / "s", df, pd.to_datetime(df["Date"], format="%b %d %Y"), OHLCV)
    r = run_cli("ingest", str(f), "-o", str(tmp_path / "cli"), "--date-format", "%b %d %Y")
    assert r.returncode == 0 and "note" in r.stdout and "Data source" in r.stdout


def test_a_vendor_url_line_and_a_twelve_hour_clock(tmp_path):
    f = write(tmp_path / "cdd.csv", CRYPTO_12H)
    rep = ingest([f], tmp_path / "s", date_format="%Y-%m-%d %I-%p")
    assert any("Timestamps are UTC timezone" in n for n in rep.notes)
    df = pd.read_csv(f, skiprows=1)
    st = open_store(tmp_path / "s")
    assert st.symbols == ["BTCUSD"] and st.freq == "60min"
    _equals_pandas(tmp_path / "s", df, pd.to_datetime(df["Date"], format="%Y-%m-%d %I-%p"),
                   {**{k: v for k, v in OHLCV.items() if k != "volume"}, "volume_usd": "Volume USD"})
    assert [str(d) for d in st.dates] == ["2019-10-17T10:00", "2019-10-17T11:00", "2019-10-17T12:00",
                                          "2019-10-17T13:00"]


def test_a_bad_cell_after_skipped_lines_names_the_files_own_line(tmp_path):
    bad = write(tmp_path / "bad.csv", "# one\n# two\ndate,close\n2020-01-02,1\n2020-01-03,x\n")
    with pytest.raises(InputError, match=r"bad\.csv: line 5: column 'close': non-numeric value 'x'"):
        ingest([bad], tmp_path / "s")
    cut = write(tmp_path / "cut.csv", "# one\ndate,close\n2020-01-02,1\n2020-01-03,2,3\n")
    with pytest.raises(InputError, match=r"cut\.csv: line 4: 3 fields, the header has 2"):
        ingest([cut], tmp_path / "s")
    fmt = write(tmp_path / "fmt.csv", "# one\ndate,close\n02.01.2020,1\n2020-01-03,2\n")
    with pytest.raises(InputError, match=r"fmt\.csv: line 4: date '2020-01-03' in column 'date' does not match"):
        ingest([fmt], tmp_path / "s", date_format="%d.%m.%Y")


def test_skip_rows(tmp_path):
    f = write(tmp_path / "X.csv", "Report of 2020\nexported by a terminal\n\nDate,Close\n2020-01-02,1.25\n"
                                  "2020-01-03,1.5\n")
    ingest([f], tmp_path / "s", skip_rows=3)
    df = pd.read_csv(f, skiprows=3)
    _equals_pandas(tmp_path / "s", df, pd.to_datetime(df["Date"]), {"close": "Close"})
    r = run_cli("ingest", str(f), "-o", str(tmp_path / "t"), "--skip-rows", "1")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "no date column" in r.stderr


def test_a_headerless_tab_file(tmp_path):
    f = write(tmp_path / "T.csv", TAB)
    r = run_cli("ingest", str(f), "-o", str(tmp_path / "s"), "--no-header", "--columns",
                "date,open,high,low,close,volume", "-q")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(f, sep="\t", header=None, names=["date", "open", "high", "low", "close", "volume"])
    _equals_pandas(tmp_path / "s", df, pd.to_datetime(df["date"]), {c: c for c in OHLCV})
    assert open_store(tmp_path / "s").symbols == ["T"]
    bad = write(tmp_path / "B.csv", "2020-01-02\t7.5\n2020-01-03\tx\n")
    with pytest.raises(InputError, match=r"B\.csv: line 2: column 'close': non-numeric value 'x'"):
        ingest([bad], tmp_path / "b", no_header=True, columns="date,close")
    for args, says in ((["--no-header"], "--no-header needs --columns"),
                       (["--columns", "date,close"], "--columns names the columns of a headerless file")):
        r = run_cli("ingest", str(f), "-o", str(tmp_path / "x"), *args)
        assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("sep", [",", ";", "\t", "|"])
def test_the_separator_is_detected(tmp_path, sep):
    text = sep.join(["date", "open", "high", "low", "close", "volume"]) + "\n" + "".join(
        sep.join([d, *map(str, v)]) + "\n" for d, v in
        (("2020-01-02", (1.5, 2.25, 1.25, 2.0, 100)), ("2020-01-03", (2.0, 2.5, 1.75, 2.25, 250))))
    f = write(tmp_path / "S.csv", text)
    ingest([f], tmp_path / "s")
    df = pd.read_csv(f, sep=sep)
    _equals_pandas(tmp_path / "s", df, pd.to_datetime(df["date"]), {c: c for c in OHLCV})


def test_dataframe_and_append_take_the_reading_options(tmp_path):
    frame = pd.DataFrame({"Date": ["19-Sep-03", "22-Sep-03"], "Close": [1.5, 2.5]})
    ingest(frame, tmp_path / "s", symbol="A", date_format="%d-%b-%y")
    assert [str(d) for d in open_store(tmp_path / "s").dates] == ["2003-09-19", "2003-09-22"]
    nxt = write(tmp_path / "A.csv", "# note\n23-Sep-03\t3.5\n")
    append(tmp_path / "s", [nxt], no_header=True, columns=["Date", "Close"])
    st = open_store(tmp_path / "s")
    assert st.array("close")[0].tolist() == [1.5, 2.5, 3.5]
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["date_format"] == "%d-%b-%y"


def test_real_files_read_with_a_format_equal_the_default_read(real, tmp_path):
    """M/D/YYYY (mplfinance's S&P file) and a stamp with seconds (czsc's index file): the same store either way."""
    for f, fmt in ((real / "yahoo_mplfinance" / "SP500_NOV2019_Hist.csv", "%m/%d/%Y"),
                   (real / "index_with_time" / "000001.SH_D.csv", "%Y-%m-%d %H:%M:%S")):
        ingest([f], tmp_path / f"{f.stem}-auto")
        ingest([f], tmp_path / f"{f.stem}-fmt", date_format=fmt)
        a, b = open_store(tmp_path / f"{f.stem}-auto"), open_store(tmp_path / f"{f.stem}-fmt")
        assert np.array_equal(a.dates, b.dates) and a.symbols == b.symbols
        np.testing.assert_array_equal(a.panel, b.panel)


def test_a_date_and_a_time_column_read_with_one_format(tmp_path):
    f = write(tmp_path / "M.csv", "date,time,close\n17.10.2019,09:31,1.5\n17.10.2019,09:32,1.75\n")
    ingest([f], tmp_path / "s", date_format="%d.%m.%Y %H:%M", symbol="M")
    assert [str(d) for d in open_store(tmp_path / "s").dates] == ["2019-10-17T09:31", "2019-10-17T09:32"]


def test_reading_refusals_leave_the_store_unchanged(tmp_path):
    ingest([write(tmp_path / "A.csv", "date,close\n2020-01-02,1\n")], tmp_path / "s")
    before = _digest(tmp_path / "s")
    nxt = write(tmp_path / "n" / "A.csv", "2020-01-03,2\n")
    for args in (["--no-header"], ["--columns", "date,close"], ["--skip-rows", "5"],
                 ["--date-format", "%d.%m.%Y"]):
        r = run_cli("append", str(tmp_path / "s"), str(nxt), *args)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr and _digest(tmp_path / "s") == before
    r = run_cli("append", str(tmp_path / "s"), str(nxt), "--no-header", "--columns", "date,close", "-q")
    assert r.returncode == 0 and open_store(tmp_path / "s").array("close")[0].tolist() == [1.0, 2.0]
