"""--skip-bad leaves out tick and quote files whatever shows they are not bars (issue 25 part 5): a
backtrader-style tick file (OHLC columns, stamps with seconds and milliseconds), found only while its rows are
read, and a bid/ask file; the bars of the folder are stored exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd

from conftest import run_cli, write
from kline_store import ingest, open_store


def tick_file(path):
    rng = np.random.default_rng(1)
    t = pd.Timestamp("2015-09-23 20:57:42.146") + pd.to_timedelta(np.cumsum(rng.uniform(0.1, 4, 200)), unit="s")
    p = np.round(3067 + np.cumsum(rng.integers(-1, 2, 200)), 2)
    rows = "".join(f"{a.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]},{x:.2f},{x:.2f},{x:.2f},{x:.2f},{v},0\n"
                   for a, x, v in zip(t, p, rng.integers(1, 200, 200)))
    return write(path, "Datetime,Open,High,Low,Close,Volume,OpenInterest\n" + rows)


def quote_file(path):
    rows = "".join(f"02/03/2010 16:53:{s:02d},0.53{s:02d},0.54{s:02d}\n" for s in range(50, 60))
    return write(path, "TIMESTAMP,BID,ASK\n" + rows)


def daily_file(path, seed):
    rng = np.random.default_rng(seed)
    d = pd.bdate_range("2020-01-02", periods=30)
    c = np.round(10 + np.cumsum(rng.normal(0, 0.1, 30)), 2)
    return write(path, "Date,Open,High,Low,Close,Volume\n" + "".join(
        f"{x.date()},{y},{y + 0.1:.2f},{y - 0.1:.2f},{y},{1000 + i}\n" for i, (x, y) in enumerate(zip(d, c))))


def test_tick_and_quote_files_are_skipped_again(tmp_path):
    d = tmp_path / "in"
    a, b = daily_file(d / "AAA.csv", 1), daily_file(d / "BBB.csv", 2)
    tick_file(d / "ticksample.csv")
    quote_file(d / "bidask.csv")
    r = run_cli("ingest", str(d), "-o", str(tmp_path / "stop"))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run_cli("ingest", str(d), "-o", str(tmp_path / "s"), "--skip-bad")
    assert r.returncode == 0, r.stderr
    assert "skipped 2 file(s)" in r.stdout and "ticksample.csv: line 2" in r.stdout and "seconds" in r.stdout
    assert "bidask.csv: bid/ask quotes, not bars" in r.stdout
    st = open_store(tmp_path / "s")
    assert st.symbols == ["AAA", "BBB"] and st.freq == "1d"
    for i, p in enumerate((a, b)):
        assert np.array_equal(st.array("close")[i], pd.read_csv(p)["Close"].to_numpy(np.float32))
    assert [s["path"].rsplit("/", 1)[-1] for s in st.manifest["sources"]] == ["AAA.csv", "BBB.csv"]


def test_a_tick_file_alone_with_skip_bad_says_no_file_holds_bars(tmp_path):
    t = tick_file(tmp_path / "ticksample.csv")
    r = run_cli("ingest", str(t), "-o", str(tmp_path / "s"), "--skip-bad")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "seconds" in r.stderr, r.stderr
    assert not (tmp_path / "s").exists()
