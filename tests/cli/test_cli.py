"""The command line as a user meets it: one-line errors, exit codes, JSON output, export round trip."""

import json

import numpy as np
import polars as pl

from conftest import run_cli, write
from kline_store import open_store


def one_line_error(r, *needles):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_bad_inputs_are_one_line_errors(tmp_path):
    out = str(tmp_path / "s")
    one_line_error(run_cli("ingest", str(tmp_path / "nope.csv"), "-o", out), "nope.csv", "no such file")
    one_line_error(run_cli("ingest", str(write(tmp_path / "e.csv", "")), "-o", out), "e.csv", "empty")
    one_line_error(run_cli("ingest", str(write(tmp_path / "n.csv", "date,open\n2024-01-02,1\n")), "-o", out),
                   "n.csv", "no close column", "columns found: date, open")
    one_line_error(run_cli("ingest", str(write(tmp_path / "v.csv", "date,close\n2024-01-02,1\n2024-01-03,x1\n")),
                           "-o", out), "v.csv", "line 3", "'x1'")
    one_line_error(run_cli("ingest", str(write(tmp_path / "d.csv", "date,close\n2024-02-30,1\n")), "-o", out),
                   "d.csv", "unparseable date '2024-02-30'")
    dup = write(tmp_path / "dup.csv", "symbol,date,close\nA,2024-01-02,1\nA,2024-01-02,2\n")
    one_line_error(run_cli("ingest", str(dup), "-o", out), "duplicate bar: symbol A date 2024-01-02")
    one_line_error(run_cli("info", str(tmp_path / "nothing")), "no such store")
    one_line_error(run_cli("verify", str(tmp_path)), "error:", "not a kline-store store")
    one_line_error(run_cli("append", str(tmp_path / "nothing"), str(dup)), "no such store")
    one_line_error(run_cli("ingest", "-o", out), "Missing argument")
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_ingest_info_export_verify(real, tmp_path):
    s = str(tmp_path / "s")
    r = run_cli("ingest", str(real / "tushare_daily"), "-o", s)
    assert r.returncode == 0 and "stored 12120 bars from 10 file(s)" in r.stdout and "10 symbols" in r.stdout
    assert r.stderr == ""
    info = json.loads(run_cli("info", s, "--json").stdout)
    assert {"symbols", "fields", "start", "end", "n_dates"} <= set(info)
    assert info["start"] == "2020-01-02" and info["end"] == "2024-12-31" and len(info["symbols"]) == 10
    assert run_cli("verify", s).returncode == 0
    r = run_cli("export", s, "-o", str(tmp_path / "out.parquet"))
    assert r.returncode == 0 and "12120 rows" in r.stdout
    df = pl.read_parquet(tmp_path / "out.parquet")
    assert df.columns[:2] == ["symbol", "date"] and df.height == 12120
    src = pl.read_csv(real / "tushare_daily" / "600519.SH.csv")
    row = df.filter((pl.col("symbol") == "600519.SH") & (pl.col("date") == pl.date(2021, 2, 10)))
    want = src.filter(pl.col("trade_date") == 20210210)["close"][0]
    assert row["close"][0] == np.float32(want)
    # Re-ingest the export: the same store.
    r = run_cli("ingest", str(tmp_path / "out.parquet"), "-o", str(tmp_path / "s2"), "-q")
    assert r.returncode == 0
    a, b = open_store(s), open_store(tmp_path / "s2")
    assert a.symbols == b.symbols and np.array_equal(a.panel, b.panel, equal_nan=True)


def test_verify_exit_code_names_file(real, tmp_path):
    s = tmp_path / "s"
    run_cli("ingest", str(real / "index_with_time"), "-o", str(s), "-q")
    f = next(s.glob("data-g*.f32"))
    data = bytearray(f.read_bytes())
    data[100] ^= 0xFF
    f.write_bytes(bytes(data))
    r = run_cli("verify", str(s))
    assert r.returncode == 1 and f.name in r.stderr and "Traceback" not in r.stderr
    one_line_error(run_cli("export", str(s), "-o", str(tmp_path / "x.parquet")), f.name, "damaged")


def test_append_cli_and_gc(tmp_path):
    write(tmp_path / "a.csv", "symbol,date,close\nA,2024-01-02,10\n")
    write(tmp_path / "b.csv", "symbol,date,close\nA,2024-01-02,11\n")
    s = str(tmp_path / "s")
    run_cli("ingest", str(tmp_path / "a.csv"), "-o", s, "-q")
    r = run_cli("append", s, str(tmp_path / "b.csv"), "--dry-run")
    assert r.returncode == 0 and "would rewrite" in r.stdout and "A 1" in r.stdout
    r = run_cli("append", s, str(tmp_path / "b.csv"))
    assert r.returncode == 0 and "mode: rewrite" in r.stdout
    assert len(list((tmp_path / "s").glob("data-g*.f32"))) == 1     # the old generation is collected
    assert "removed 0 file(s)" in run_cli("gc", s).stdout


def test_import_does_not_load_torch():
    import subprocess
    import sys
    code = "import sys, kline_store, kline_store.cli; kline_store.open_store; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_issue_9_inputs_are_one_short_line(tmp_path):
    """Case 1 (the issue's command), case 8 (dates out of range, a pandas MultiIndex header of 15k characters)."""
    out = str(tmp_path / "s")
    cut = write(tmp_path / "cut.csv", "Date,Open,High,Low,Close,Adj Close,Volume\n"
                "2017-09-05,100.5,102.25,99.75,101.0,101.0,1000\n2017-09-06,101.5\n")
    one_line_error(run_cli("ingest", str(cut), "-o", out), "cut.csv", "line 3: 2 fields, the header has 7")
    for i, day in enumerate(("0001-01-01", "9999-12-31")):
        f = write(tmp_path / f"d{i}.csv", f"date,close\n2024-01-02,1\n{day},2\n")
        one_line_error(run_cli("ingest", str(f), "-o", out), f"d{i}.csv", "line 3", day, "outside 1800-01-01..2200-12-31")
    tickers = [f"T{i:04d}" for i in range(1200)]
    multi = write(tmp_path / "yf.csv", "Price," + ",".join(["Close"] * 1200) + "\nTicker," + ",".join(tickers) +
                  "\nDate," + "," * 1199 + "\n2024-01-02," + ",".join(["1.5"] * 1200) + "\n")
    r = run_cli("ingest", str(multi), "-o", out)
    one_line_error(r, "yf.csv", "no date column", "columns found: Price, Close, Close_duplicated_0", "(1,201 in all)")
    assert len(r.stderr) < 600
    assert not (tmp_path / "s").exists()
