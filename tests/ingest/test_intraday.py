"""Intraday stores end to end on the real Shanghai Composite minute bars: exact values, sessions, windows across
the lunch break, exact resampling (the 11 days equal the daily file), appends equal to a full ingest, export
round trips, and the errors a user meets."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import polars as pl
import pytest

from conftest import run_cli, write
from kline_store import KlineDataset, append, ingest, make_splits, open_store
from kline_store.samples.cross_section import CrossSectionDataset
from kline_store.errors import InputError
from kline_store.ingest.exporter import to_frame
from kline_store.ingest.resample import resample

MIN = "intraday_ashare_1min/000001.XSHG_1MIN.csv"


@pytest.fixture(scope="module")
def minutes(real, tmp_path_factory):
    path = tmp_path_factory.mktemp("intraday") / "m"
    ingest([real / MIN], path)
    return path


@pytest.fixture(scope="module")
def source(real):
    return pl.read_csv(real / MIN)


def test_minute_bars_are_stored_exactly_with_240_a_day(minutes, source):
    st = open_store(minutes)
    assert st.freq == "1min" and st.dates.dtype == np.dtype("datetime64[m]") and st.n_dates == len(source)
    days, counts = np.unique(st.dates.astype("datetime64[D]"), return_counts=True)
    assert len(days) == 11 and set(counts) == {240}
    assert str(st.dates[0]) == "2020-07-01T09:31" and str(st.dates[-1]) == "2020-07-15T15:00"
    for f in ("open", "close", "high", "low"):
        assert np.array_equal(st.array(f)[0], source[f].to_numpy().astype(np.float32))
    assert np.array_equal(st.array("volume")[0], source["vol"].to_numpy().astype(np.float32))
    info = json.loads(run_cli("info", str(minutes), "--json").stdout)
    assert info["freq"] == "1min" and info["timezone"] == "exchange-local, naive"


def test_windows_run_across_the_lunch_break(minutes, source):
    ds = KlineDataset(minutes, window=10, horizon=5)
    s, t = ds.locate(np.arange(len(ds)))
    dates = ds.store.dates
    k = int(np.flatnonzero(dates[t] == np.datetime64("2020-07-01T13:03"))[0])
    i = source["dt"].to_list().index("2020-07-01 13:03:00")
    rows = source[i - 9: i + 1]
    assert rows["dt"][6] == "2020-07-01 11:30:00" and rows["dt"][7] == "2020-07-01 13:01:00"
    x = ds[k]["x"].numpy()
    assert np.array_equal(x[:, 0], rows["open"].to_numpy().astype(np.float32))      # the session bars only
    c = source["close"].to_numpy().astype(np.float32).astype(np.float64)   # stored as float32
    label = c[i + 5] / c[i] - 1
    assert ds[k]["y"].item() == pytest.approx(label, rel=1e-6)
    # next day's first window: the previous day's afternoon, no overnight gap bars
    first = int(np.flatnonzero(dates[t] == np.datetime64("2020-07-02T09:35"))[0])
    assert str(dates[t[first] - 9]) == "2020-07-01T14:56"
    xs = CrossSectionDataset(ds)
    assert len(xs) == len(ds) and xs[0]["x"].shape == (1, 10, 5)                 # all symbols at one bar


def test_splits_by_date_with_an_embargo_in_bars(minutes):
    sp = make_splits(minutes, train=("2020-07-01", "2020-07-08"), valid=("2020-07-09", None), window=30, horizon=5)
    dates = open_store(minutes).dates
    last_label = dates[sp.train.label_days(np.arange(len(sp.train))).max()]
    first_t = sp.valid.locate(np.arange(len(sp.valid)))[1].min()
    assert str(dates[first_t]) == "2020-07-09T09:31" and str(last_label) == "2020-07-08T14:55"
    assert np.searchsorted(dates, np.datetime64("2020-07-09T09:31")) - np.searchsorted(dates, last_label) > 5
    late = KlineDataset(minutes, window=10, start="2020-07-15 14:00")
    assert str(dates[late.locate([0])[1][0]]) == "2020-07-15T14:00"


def test_resampled_days_equal_the_daily_file(minutes, real, tmp_path):
    rep = resample(minutes, tmp_path / "d", "1d")
    st = open_store(tmp_path / "d")
    assert rep.n_periods == 11 and st.freq == "1d"
    daily = pl.read_csv(real / "index_with_time" / "000001.SH_D.csv").with_columns(pl.col("dt").str.slice(0, 10))
    daily = daily.filter(pl.col("dt").is_in([str(d) for d in st.dates]))
    assert daily.height == 11
    f32 = {c: daily[c].to_numpy().astype(np.float32) for c in ("open", "close", "high", "low")}
    assert np.array_equal(st.array("open")[0], f32["open"]) and np.array_equal(st.array("close")[0], f32["close"])
    assert (st.array("high")[0] <= f32["high"]).all() and (st.array("low")[0] >= f32["low"]).all()


def test_resampling_aggregates_each_period(minutes, source, tmp_path):
    resample(minutes, tmp_path / "h", "60min")
    hourly = open_store(tmp_path / "h")
    assert [str(d)[11:] for d in hourly.dates[:4]] == ["10:30", "11:30", "14:00", "15:00"]   # A-share hours
    resample(minutes, tmp_path / "f", "5min")
    five = open_store(tmp_path / "f")
    assert five.n_dates == 11 * 48
    src = source.with_columns(pl.col("dt").str.to_datetime()).with_row_index("i")
    want = src.group_by((pl.col("i") // 5)).agg(pl.col("open").first(), pl.col("high").max(), pl.col("low").min(),
                                                 pl.col("close").last(), pl.col("vol").sum(),
                                                 pl.col("dt").last()).sort("i")
    assert [str(d) for d in five.dates[:2]] == ["2020-07-01T09:35", "2020-07-01T09:40"]
    for f, col in (("open", "open"), ("high", "high"), ("low", "low"), ("close", "close")):
        assert np.array_equal(five.array(f)[0], want[col].to_numpy().astype(np.float32)), f
    np.testing.assert_allclose(five.array("volume")[0], want["vol"].to_numpy(), rtol=1e-6)
    with pytest.raises(InputError, match="not a multiple"):
        resample(tmp_path / "h", tmp_path / "x", "90min")
    with pytest.raises(InputError, match="coarser size"):
        resample(tmp_path / "h", tmp_path / "y", "5min")
    resample(tmp_path / "h", tmp_path / "hd", "1d")
    with pytest.raises(InputError, match="a daily store"):
        resample(tmp_path / "hd", tmp_path / "z", "1d")


def test_four_years_with_missing_minutes_on_the_session_calendar(real, tmp_path):
    with zipfile.ZipFile(real / "intraday_ashare_1min" / "000001.XSHG_1min.zip") as z:
        z.extractall(tmp_path)
    csv = tmp_path / "000001.XSHG_1min.csv"
    rep = ingest([csv], tmp_path / "s", sessions="ashare")
    st = open_store(tmp_path / "s")
    assert rep.n_bars == 239_550 and st.n_dates == 1000 * 240 and st.manifest["sessions"]["name"] == "ashare"
    close = st.array("close")[0]
    days, counts = np.unique(st.dates.astype("datetime64[D]")[np.isfinite(close)], return_counts=True)
    assert dict(zip(*np.unique(counts, return_counts=True))) == {17: 1, 142: 1, 236: 2, 238: 2, 239: 117, 240: 877}
    src = pl.read_csv(csv).with_columns(pl.col("dt").str.to_datetime())
    stamps = src["dt"].to_numpy().astype("datetime64[m]")
    pos = np.searchsorted(st.dates, stamps)
    assert np.array_equal(st.dates[pos], stamps)                                   # every bar at its stamp
    assert np.array_equal(close[pos], src["close"].to_numpy().astype(np.float32))
    assert np.isnan(close).sum() == 240_000 - 239_550                              # the missing minutes
    # a day with 239 bars: its missing minute is NaN on the session calendar, its neighbours are bars
    short = days[counts == 239][0]
    on_day = (st.dates.astype("datetime64[D]") == short)
    missing = st.dates[on_day][np.isnan(close[on_day])]
    assert len(missing) == 1 and missing[0] not in set(stamps)


def test_resampling_stays_on_the_grid_when_minutes_are_missing(real, tmp_path):
    """Without a session template the calendar is the input's stamps: a missing minute (14:59 on 117 days) once
    started a new session and shifted every later period of that day off the grid (09:42, 10:37, 12:01, ...)."""
    with zipfile.ZipFile(real / "intraday_ashare_1min" / "000001.XSHG_1min.zip") as z:
        z.extractall(tmp_path)
    ingest([tmp_path / "000001.XSHG_1min.csv"], tmp_path / "s")
    for freq, grid, per_day in (("5min", [m for a, b in ((570, 690), (780, 900)) for m in range(a + 5, b + 1, 5)],
                                 48),
                                ("60min", [630, 690, 840, 900], 4)):
        resample(tmp_path / "s", tmp_path / freq, freq)
        minute = open_store(tmp_path / freq).dates.astype(np.int64)
        assert np.isin(minute % 1440, grid).all(), np.unique(minute[~np.isin(minute % 1440, grid)] % 1440)
        counts = np.unique(minute // 1440, return_counts=True)[1]
        assert (counts == per_day).sum() == 998 and counts.max() == per_day   # all but the 17- and 142-bar days


def test_bars_outside_the_sessions_are_errors(tmp_path):
    p = write(tmp_path / "m.csv", "dt,close\n2024-01-02 09:31,1\n2024-01-02 09:32,2\n2024-01-02 12:00,3\n")
    with pytest.raises(InputError, match=r"1 bar\(s\) at 1 time\(s\) not in the calendar \(2024-01-02 12:00\).*m.csv line 4"):
        ingest([p], tmp_path / "s", sessions="ashare")
    ingest([p], tmp_path / "u")                                                    # the union calendar: fine
    assert open_store(tmp_path / "u").n_dates == 3


def test_append_of_the_last_day_equals_a_full_ingest(real, tmp_path):
    src = pl.read_csv(real / MIN)
    head, last = src.filter(pl.col("dt") < "2020-07-15"), src.filter(pl.col("dt") >= "2020-07-15")
    head.write_csv(tmp_path / "head.csv")
    last.write_csv(tmp_path / "last.csv")
    for sessions in (None, "ashare"):
        ingest([tmp_path / "head.csv"], tmp_path / f"a{sessions}", sessions=sessions)
        rep = append(tmp_path / f"a{sessions}", [tmp_path / "last.csv"])
        ingest([real / MIN], tmp_path / f"f{sessions}", sessions=sessions)
        a, f = open_store(tmp_path / f"a{sessions}"), open_store(tmp_path / f"f{sessions}")
        assert rep.extra["mode"] == "tail" and rep.extra["new dates"] == 240
        assert np.array_equal(a.dates, f.dates) and np.array_equal(a.panel, f.panel, equal_nan=True)
    with pytest.raises(InputError, match="a daily store"):
        daily = write(tmp_path / "d.csv", "date,close\n2020-06-30,1\n")
        ingest([daily], tmp_path / "daily")
        append(tmp_path / "daily", [tmp_path / "last.csv"])


def test_export_round_trips_and_re_ingests(minutes, tmp_path):
    df = to_frame(minutes)
    assert df.columns[:2] == ["symbol", "time"] and df.height == 2640
    for suffix in ("csv", "parquet"):
        out = tmp_path / f"x.{suffix}"
        assert run_cli("export", str(minutes), "-o", str(out)).returncode == 0
        ingest([out], tmp_path / suffix)
        a, b = open_store(minutes), open_store(tmp_path / suffix)
        assert b.freq == "1min" and np.array_equal(a.dates, b.dates)
        assert np.array_equal(a.panel, b.panel, equal_nan=True)


def test_bar_size_options_and_messages(real, tmp_path):
    r = run_cli("ingest", str(real / MIN), "-o", str(tmp_path / "d"), "--freq", "1d")
    assert r.returncode == 1 and "appears 240 times" in r.stderr and "intraday file?" in r.stderr
    hourly = "time,open,high,low,close\n" + "".join(
        f"2024-01-0{d} {h:02d}:00,1.1,1.2,1.0,1.1\n" for d in (2, 3) for h in range(24))
    p = write(tmp_path / "EURUSD_H1.csv", hourly)
    ingest([p], tmp_path / "fx")
    assert open_store(tmp_path / "fx").freq == "60min"                            # detected, 24 bars a day
    for args, msg in ((["--freq", "7min"], "divide a day"), (["--freq", "2d"], "longer than a day"),
                      (["--sessions", "tokyo"], "not a template"), (["--stamp", "end"], "applies with --sessions")):
        r = run_cli("ingest", str(p), "-o", str(tmp_path / "bad"), *args)
        code = 2 if args[0] == "--freq" else 1      # a bad --freq is a usage error (#18)
        assert r.returncode == code and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
    daily = write(tmp_path / "day.csv", "date,close\n2024-01-02 15:00:00,1\n2024-01-03 15:00:00,2\n")
    ingest([daily], tmp_path / "dd")
    assert open_store(tmp_path / "dd").freq == "1d"                               # a close stamp stays daily
    with pytest.raises(InputError, match="applies to intraday"):
        ingest([daily], tmp_path / "ds", sessions="ashare")
    # a bar size the stamps contradict, and bars an intraday store cannot take, are refused naming the line
    r = run_cli("ingest", str(real / MIN), "-o", str(tmp_path / "m5"), "--freq", "5min")
    assert r.returncode == 1 and "MIN.csv line 3: --freq 5min: bar at 2020-07-01 09:32 is less than 5min" in r.stderr
    assert not (tmp_path / "m5").exists()
    ingest([real / MIN], tmp_path / "m1")
    days = write(tmp_path / "days.csv", "symbol,dt,open,close,high,low,vol\n000001.XSHG,2020-07-16,1,1,1,1,1\n")
    with pytest.raises(InputError, match=r"days\.csv line 2: bars without a time of day \(daily bars\?\)"):
        append(tmp_path / "m1", [days])                          # 2020-07-16 00:00 among the minutes, once
    assert open_store(tmp_path / "m1").n_dates == 2640
    ingest([p], tmp_path / "fx2")
    before = open_store(tmp_path / "fx2").dates.copy()
    finer = write(tmp_path / "m1.csv", "time,open,high,low,close\n2024-01-04 09:00,1,1,1,1\n2024-01-04 09:01,1,1,1,1\n")
    with pytest.raises(InputError, match=r"m1\.csv line 3: bar at 2024-01-04 09:01 is less than 60min after"):
        append(tmp_path / "fx2", [finer])
    assert np.array_equal(open_store(tmp_path / "fx2").dates, before)


def test_a_24_hour_day_stamped_at_its_end_keeps_its_midnight_bar(tmp_path):
    """Bars stamped 00:01 .. 24:00: the 24:00 bar once opened a phantom NaN day and a stray daily bar of 1."""
    stamps = np.datetime64("2021-01-04T00:01") + np.arange(2 * 1440).astype("timedelta64[m]")
    pl.DataFrame({"time": stamps.astype("datetime64[ms]"), "open": 1.0, "high": 1.0, "low": 1.0, "close": 1.0,
                  "volume": 1.0}).write_csv(tmp_path / "btc.csv")
    ingest([tmp_path / "btc.csv"], tmp_path / "s", sessions="24h", stamp="end")
    st = open_store(tmp_path / "s")
    assert st.n_dates == 2880 and str(st.dates[-1]) == "2021-01-06T00:00" and np.isfinite(st.array("close")).all()
    resample(tmp_path / "s", tmp_path / "d", "1d")
    d = open_store(tmp_path / "d")
    assert [str(x) for x in d.dates] == ["2021-01-04", "2021-01-05"] and d.array("volume")[0].tolist() == [1440] * 2
    resample(tmp_path / "s", tmp_path / "h", "60min")
    h = open_store(tmp_path / "h")
    assert h.n_dates == 48 and str(h.dates[-1]) == "2021-01-06T00:00" and (h.array("volume")[0] == 60).all()


def test_the_rest_of_a_trading_day_appends_at_the_tail(real, tmp_path):
    """With --sessions, a morning's bars then the afternoon's: the afternoon once counted as 600 revised cells
    and rewrote the whole data file (the morning's append had laid out the afternoon as NaN)."""
    src = pl.read_csv(real / MIN)
    last = src["dt"].str.starts_with("2020-07-15")
    morning = last & (src["dt"].str.slice(11, 5) <= "11:30")
    parts = {"base": src.filter(~last), "am": src.filter(morning), "pm": src.filter(last & ~morning)}
    for name, df in parts.items():
        df.write_csv(tmp_path / f"{name}.csv")
    ingest([tmp_path / "base.csv"], tmp_path / "s", sessions="ashare")
    for name in ("am", "pm"):
        rep = append(tmp_path / "s", [tmp_path / f"{name}.csv"])
        assert rep.extra["mode"] == "tail" and rep.extra["revised cells"].startswith("0 "), rep.extra
    assert sorted(p.name for p in (tmp_path / "s").glob("data-*.f32")) == ["data-g000001.f32"]
    ingest([real / MIN], tmp_path / "full", sessions="ashare")
    a, b = open_store(tmp_path / "s"), open_store(tmp_path / "full")
    assert np.array_equal(a.dates, b.dates) and np.array_equal(a.panel, b.panel, equal_nan=True)


def test_a_daily_file_with_a_stray_time_of_day_stays_daily(real, tmp_path):
    """One 14:59 among the 15:00 close stamps once failed with 'cannot tell the bar size', naming no file."""
    lines = (real / "index_with_time" / "000001.SH_D.csv").read_text().splitlines(keepends=True)
    lines[99] = lines[99].replace("15:00:00", "14:59:00")
    head, tail = "".join(lines[:2000]), lines[0] + "".join(lines[2000:])
    ingest([write(tmp_path / "a.csv", head)], tmp_path / "s")
    append(tmp_path / "s", [write(tmp_path / "b.csv", tail.replace("15:00:00", "14:58:00", 1))])
    st = open_store(tmp_path / "s")
    assert st.freq == "1d" and st.n_dates == 3332 and np.isfinite(st.array("close")).sum() == 3332
    with pytest.raises(InputError, match=r"MIN\.csv line 2: 1min bars \(several a day\) for .*, a daily store"):
        append(tmp_path / "s", [real / MIN])


def test_am_pm_and_utc_offsets_land_on_the_exchange_clock(tmp_path):
    """Issue 19: 1:31 PM was stored as 01:31 (before the morning); +08:00 and Z kept their wall clocks."""
    p = write(tmp_path / "m.csv", "dt,close\n7/1/2020 9:31 AM,1\n7/1/2020 9:32 AM,2\n7/1/2020 1:31 PM,3\n")
    ingest([p], tmp_path / "s", sessions="ashare")
    assert [str(d) for d in open_store(tmp_path / "s").dates[[0, -1]]] == ["2020-07-01T09:31", "2020-07-01T13:31"]
    q = write(tmp_path / "z.csv", "dt,close\n2020-07-01T09:31:00+08:00,1\n2020-07-01T01:32:00Z,2\n")
    r = run_cli("ingest", str(q), "-o", str(tmp_path / "bad"))
    assert r.returncode == 1 and "different UTC offsets" in r.stderr and "--timezone" in r.stderr
    r = run_cli("ingest", str(q), "-o", str(tmp_path / "z"), "--timezone", "Asia/Shanghai")
    assert r.returncode == 0, r.stderr
    st = open_store(tmp_path / "z")
    assert [str(d) for d in st.dates] == ["2020-07-01T09:31", "2020-07-01T09:32"]
    assert json.loads(run_cli("info", str(tmp_path / "z"), "--json").stdout)["timezone"] == "Asia/Shanghai"
    more = write(tmp_path / "more.csv", "dt,close\n2020-07-01T01:33:00Z,3\n2020-07-01T09:34:00+08:00,4\n")
    append(tmp_path / "z", [more])     # the store's zone converts the append's stamps too
    assert [str(d) for d in open_store(tmp_path / "z").dates[2:]] == ["2020-07-01T09:33", "2020-07-01T09:34"]


def test_a_day_of_pre_session_bars_with_sessions_is_one_line(tmp_path):
    """Issue 19: a single day of pre-session bars with --sessions gave "unexpected IndexError"."""
    p = write(tmp_path / "pre.csv", "dt,close\n2024-01-02 08:01,1\n2024-01-02 08:02,2\n")
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "s"), "--sessions", "ashare", "--freq", "1min")
    assert r.returncode == 1 and "not in the calendar (2024-01-02 08:01, 2024-01-02 08:02)" in r.stderr
    assert "unexpected" not in r.stderr and not (tmp_path / "s").exists()
