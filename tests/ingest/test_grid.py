"""One bar size per store (issue 25 part 1): files and symbols of different sizes refused naming two of them (or
the majority kept with --skip-bad), appends of another size refused in both directions before anything is
written, and bars off the store's grid (16:02 in a 5-minute store) refused or dropped and counted."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli, write
from kline_store import append, ingest, open_store
from kline_store.errors import InputError


def bars_csv(path: Path, stamps: list[str], symbol: str | None = None, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    close = np.round(10 + np.cumsum(rng.normal(0, 0.1, len(stamps))), 2)
    head = ("symbol," if symbol else "") + "datetime,open,high,low,close,volume\n"
    rows = [(f"{symbol}," if symbol else "") + f"{t},{c},{c + 0.05:.2f},{c - 0.05:.2f},{c},{100 + i}\n"
            for i, (t, c) in enumerate(zip(stamps, close))]
    return write(path, head + "".join(rows))


def minutes(days: list[str], every: int, start: str = "09:30", end: str = "16:00") -> list[str]:
    out = []
    for d in days:
        t = pd.date_range(f"{d} {start}", f"{d} {end}", freq=f"{every}min")
        out += [s.strftime("%Y-%m-%d %H:%M") for s in t]
    return out


DAYS = ["2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05", "2024-01-08"]


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + p.read_bytes())
    return h.hexdigest()


def one_line_refusal(args: list[str], *needles: str) -> str:
    r = run_cli(*args)
    err = r.stderr.strip()
    assert r.returncode == 1 and "\n" not in err and "Traceback" not in err, r.stderr
    for n in needles:
        assert n in err, err
    return err


def test_a_daily_and_a_minute_file_of_one_symbol_are_refused(tmp_path):
    day = bars_csv(tmp_path / "in" / "AAA_daily.csv", [f"{d} 00:00" for d in DAYS])
    one = bars_csv(tmp_path / "in" / "AAA_1min.csv", minutes(DAYS[:2], 1), seed=1)
    one_line_refusal(["ingest", str(day), str(one), "-o", str(tmp_path / "s")],
                     "AAA_daily.csv", "daily bars (1d)", "AAA_1min.csv holds 1-minute bars (1min)", "one bar size")
    assert not (tmp_path / "s").exists()


def test_a_folder_of_five_sizes_keeps_the_majority_with_skip_bad(tmp_path):
    d = tmp_path / "in"
    bars_csv(d / "a_daily.csv", [f"{x} 00:00" for x in DAYS])
    for k, name in ((1, "b_1min"), (2, "c_2min"), (60, "e_hourly")):
        bars_csv(d / f"{name}.csv", minutes(DAYS[:2], k), seed=k)
    for s in ("f", "g", "h"):
        bars_csv(d / f"{s}_5min.csv", minutes(DAYS[:3], 5), seed=ord(s))
    one_line_refusal(["ingest", str(d), "-o", str(tmp_path / "s")], "5-minute bars (5min)", "one bar size")
    rep = ingest([d], tmp_path / "s", skip_bad=True)
    st = open_store(tmp_path / "s")
    assert st.freq == "5min" and sorted(st.symbols) == ["f_5min", "g_5min", "h_5min"]
    listed = dict(rep.skipped_files)
    assert len(listed) == 4 and "daily bars (1d)" in listed[str(d / "a_daily.csv")]
    assert "2-minute bars (2min)" in listed[str(d / "c_2min.csv")]
    src = pd.read_csv(d / "g_5min.csv")
    assert np.array_equal(st.array("close")[st.symbols.index("g_5min")][np.isfinite(st.array("close")[1])],
                          src["close"].to_numpy(np.float32))


def test_daily_and_hourly_bars_of_a_24h_market(tmp_path):
    days = pd.date_range("2019-07-01", periods=40, freq="D")
    daily = bars_csv(tmp_path / "BTC_d.csv", [t.strftime("%Y-%m-%d 00:00") for t in days])
    hours = pd.date_range("2019-07-01", periods=24 * 5, freq="h")
    hourly = bars_csv(tmp_path / "BTC_1h.csv", [t.strftime("%Y-%m-%d %H:%M") for t in hours], seed=3)
    one_line_refusal(["ingest", str(daily), str(hourly), "-o", str(tmp_path / "s")],
                     "BTC_d.csv daily bars (1d)", "BTC_1h.csv holds 60-minute bars (60min)")
    # an hourly store refuses the daily file, and the daily store the hourly one, before anything is written
    ingest([hourly], tmp_path / "h")
    before = tree_hash(tmp_path / "h")
    one_line_refusal(["append", str(tmp_path / "h"), str(daily)], "BTC_d.csv holds daily bars (1d)",
                     "a store of 60-minute bars (60min)")
    assert tree_hash(tmp_path / "h") == before
    ingest([daily], tmp_path / "d")
    before = tree_hash(tmp_path / "d")
    one_line_refusal(["append", str(tmp_path / "d"), str(hourly)], "60min bars", "a daily store")
    assert tree_hash(tmp_path / "d") == before


def test_a_file_whose_symbols_have_different_sizes(tmp_path):
    a = bars_csv(tmp_path / "a.csv", [f"{d} 00:00" for d in DAYS], symbol="DAY")
    b = bars_csv(tmp_path / "b.csv", minutes(DAYS[:2], 1), symbol="MIN", seed=2)
    both = write(tmp_path / "both.csv", a.read_text() + "".join(b.read_text().splitlines(True)[1:]))
    one_line_refusal(["ingest", str(both), "-o", str(tmp_path / "s")], "both.csv: symbol DAY holds daily bars (1d)",
                     "symbol MIN 1-minute bars (1min)")
    rep = ingest([both], tmp_path / "s", skip_bad=True)
    assert open_store(tmp_path / "s").symbols == ["MIN"] and "DAY" in rep.skipped_files[0][1]


def test_appends_of_coarser_or_finer_minutes_are_refused(tmp_path):
    one = bars_csv(tmp_path / "one.csv", minutes(DAYS[:2], 1))
    five = bars_csv(tmp_path / "five.csv", minutes(DAYS[2:4], 5), seed=5)
    ingest([one], tmp_path / "m1")
    before = tree_hash(tmp_path / "m1")
    one_line_refusal(["append", str(tmp_path / "m1"), str(five)], "five.csv holds 5-minute bars (5min)",
                     "a store of 1-minute bars (1min)")
    assert tree_hash(tmp_path / "m1") == before
    ingest([bars_csv(tmp_path / "five0.csv", minutes(DAYS[:2], 5))], tmp_path / "m5")
    before = tree_hash(tmp_path / "m5")
    finer = bars_csv(tmp_path / "one2.csv", minutes(DAYS[2:4], 1))
    one_line_refusal(["append", str(tmp_path / "m5"), str(finer)], "one2.csv holds 1-minute bars (1min)",
                     "5-minute bars (5min)")
    assert tree_hash(tmp_path / "m5") == before


def off_grid_file(tmp_path: Path) -> Path:
    stamps = minutes(DAYS[:3], 5)
    at = stamps.index("2024-01-03 16:00") + 1
    stamps.insert(at, "2024-01-03 16:02")
    stamps.sort()
    return bars_csv(tmp_path / "v5.csv", stamps, seed=7)


@pytest.mark.parametrize("freq", [[], ["--freq", "5min"]])
def test_a_bar_off_the_grid_is_refused_or_dropped_and_counted(tmp_path, freq):
    p = off_grid_file(tmp_path)
    line = 1 + pd.read_csv(p)["datetime"].tolist().index("2024-01-03 16:02") + 1
    one_line_refusal(["ingest", str(p), "-o", str(tmp_path / "s"), *freq],
                     f"v5.csv line {line}: bar at 2024-01-03 16:02", "off the grid", "1 such bar")
    assert not (tmp_path / "s").exists()
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "s"), "--skip-bad", *freq)
    assert r.returncode == 0 and "left out 1 bar(s) off the grid" in r.stdout, r.stdout + r.stderr
    st = open_store(tmp_path / "s")
    src = pd.read_csv(p)
    src = src[src["datetime"] != "2024-01-03 16:02"]
    assert st.freq == "5min" and st.n_dates == len(src)
    assert np.array_equal(st.array("close")[0], src["close"].to_numpy(np.float32))
    assert "2024-01-03T16:02" not in [str(x) for x in st.dates]


def test_an_off_grid_bar_in_an_append_is_refused_or_dropped(tmp_path):
    ingest([bars_csv(tmp_path / "a.csv", minutes(DAYS[:2], 5))], tmp_path / "m5")
    before = tree_hash(tmp_path / "m5")
    stamps = minutes(DAYS[2:3], 5, end="15:55") + ["2024-01-04 16:02"]   # 7 minutes after 15:55: not finer
    b = bars_csv(tmp_path / "b.csv", stamps)
    one_line_refusal(["append", str(tmp_path / "m5"), str(b)],
                     f"b.csv line {len(stamps) + 1}: bar at 2024-01-04 16:02", "off the grid")
    near = bars_csv(tmp_path / "c.csv", minutes(DAYS[2:3], 5) + ["2024-01-04 16:02"])   # 2 minutes after 16:00
    one_line_refusal(["append", str(tmp_path / "m5"), str(near)], "c.csv line", "bar at 2024-01-04 16:02")
    assert tree_hash(tmp_path / "m5") == before
    r = run_cli("append", str(tmp_path / "m5"), str(b), "--skip-bad")
    assert r.returncode == 0 and "left out 1 bar(s) off the grid" in r.stdout, r.stdout + r.stderr
    st = open_store(tmp_path / "m5")
    assert str(st.dates[-1]) == "2024-01-04T15:55"
    got = st.array("close")[st.symbols.index("b")]
    assert np.array_equal(got[np.isfinite(got)], pd.read_csv(b)["close"].to_numpy(np.float32)[:-1])


def test_a_thin_minute_file_is_still_one_minute(tmp_path):
    rng = np.random.default_rng(0)
    full = minutes(DAYS[:2], 1)
    thin = sorted(rng.choice(full, size=len(full) // 3, replace=False).tolist())
    ingest([bars_csv(tmp_path / "thin.csv", thin), bars_csv(tmp_path / "full.csv", full)], tmp_path / "s")
    assert open_store(tmp_path / "s").freq == "1min"


def test_weekly_beside_daily_keeps_its_message(tmp_path):
    week = [t.strftime("%Y-%m-%d") for t in pd.date_range("2024-01-05", periods=12, freq="W-FRI")]
    w = bars_csv(tmp_path / "w.csv", week)
    d = bars_csv(tmp_path / "d.csv", [t.strftime("%Y-%m-%d") for t in pd.bdate_range("2024-01-02", periods=30)])
    with pytest.raises(InputError, match="weekly bars"):
        ingest([d, w], tmp_path / "s")


def test_a_long_file_of_daily_and_weekly_symbols(tmp_path):
    days = [t.strftime("%Y-%m-%d") for t in pd.bdate_range("2024-01-02", periods=40)]
    weeks = [t.strftime("%Y-%m-%d") for t in pd.date_range("2024-01-05", periods=12, freq="W-FRI")]
    a = bars_csv(tmp_path / "a.csv", days, symbol="DAILY")
    b = bars_csv(tmp_path / "b.csv", weeks, symbol="WEEKLY", seed=1)
    c = bars_csv(tmp_path / "c.csv", days, symbol="DAILY2", seed=2)
    both = write(tmp_path / "both.csv", a.read_text() + "".join(b.read_text().splitlines(True)[1:])
                 + "".join(c.read_text().splitlines(True)[1:]))
    one_line_refusal(["ingest", str(both), "-o", str(tmp_path / "s")], "both.csv: symbol WEEKLY holds weekly bars (1w)",
                     "symbol DAILY daily bars (1d)")
    assert not (tmp_path / "s").exists()
    rep = ingest([both], tmp_path / "s", skip_bad=True)
    st = open_store(tmp_path / "s")
    assert st.symbols == ["DAILY", "DAILY2"] and st.manifest["bar"] == "1d" and st.n_dates == 40
    assert "WEEKLY (1w)" in rep.skipped_files[0][1]
    src = pd.read_csv(c)
    assert np.array_equal(st.array("close")[1], src["close"].to_numpy(np.float32))


def test_daily_and_weekly_files_keep_the_majority_with_skip_bad(tmp_path):
    weeks = [t.strftime("%Y-%m-%d") for t in pd.date_range("2024-01-05", periods=12, freq="W-FRI")]
    days = [t.strftime("%Y-%m-%d") for t in pd.bdate_range("2024-01-02", periods=40)]
    files = [bars_csv(tmp_path / f"w{i}.csv", weeks, seed=i) for i in range(2)] + [bars_csv(tmp_path / "d.csv", days)]
    rep = ingest(files, tmp_path / "s", skip_bad=True)
    st = open_store(tmp_path / "s")
    assert st.manifest["bar"] == "1w" and st.symbols == ["w0", "w1"]
    assert rep.skipped_files == [(str(tmp_path / "d.csv"), "holds daily bars (1d); the store takes the weekly bars "
                                                         "(1w) most files hold")]
