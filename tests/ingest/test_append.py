"""Daily operation: append equals full ingest, alignment by date, revisions, crash safety, snapshots, locks."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import run_cli, write
from kline_store import StoreLockedError, append, ingest, open_store, verify_store
from kline_store.errors import InputError
from kline_store.store.lock import WriterLock

QFQ = ["000001", "000627", "000670", "000792", "600777", "001221", "001277", "600816", "600519"]


def split_inputs(real: Path, tmp: Path, cut: str) -> tuple[Path, Path, Path]:
    """Per-symbol files of data_20251009 split at ``cut`` into folders a/ (before) and b/ (on and after)."""
    src = real / "ashare_qfq_daily" / "data_20251009"
    a, b, full = tmp / "a", tmp / "b", tmp / "full"
    for d in (a, b, full):
        d.mkdir()
    for s in QFQ:
        df = pl.read_csv(src / f"{s}.csv", infer_schema_length=0)
        df.write_csv(full / f"{s}.csv")
        before, after = df.filter(pl.col("date") < cut), df.filter(pl.col("date") >= cut)
        if before.height:
            before.write_csv(a / f"{s}.csv")
        if after.height:
            after.write_csv(b / f"{s}.csv")
    return a, b, full


def assert_same_store(x, y):
    """Cell for cell, NaN for NaN, aligned by symbol name (append adds new listings as new rows at the end)."""
    assert sorted(x.symbols) == sorted(y.symbols) and list(x.dates) == list(y.dates) and x.fields == y.fields
    order = [x.symbols.index(s) for s in y.symbols]
    assert np.array_equal(np.asarray(x.panel)[order], y.panel, equal_nan=True)
    assert x.first_bar[order].tolist() == y.first_bar.tolist()
    assert x.last_bar[order].tolist() == y.last_bar.tolist()
    assert x.manifest["n_bars"] == y.manifest["n_bars"]


@pytest.mark.parametrize("cut", ["2021-01-04", "2025-06-03"])
def test_append_equals_full_ingest_on_real_data(real, tmp_path, cut):
    a, b, full = split_inputs(real, tmp_path, cut)
    ingest([a], tmp_path / "s")
    rep = append(tmp_path / "s", [b])
    assert rep.extra["mode"] == "tail"
    ingest([full], tmp_path / "ref")
    x, y = open_store(tmp_path / "s", verify=True), open_store(tmp_path / "ref")
    assert_same_store(x, y)
    if cut == "2025-06-03":
        assert "001221" in rep.extra["new symbols"]           # listed after the cut: a new row
        assert x.symbols[-1] == "001221"
        i = x.symbol_index("000627")                          # suspended across the cut, then delisted
        close = x.array("close")[i]
        gap = (x.dates > np.datetime64("2025-04-30")) & (x.dates < np.datetime64("2025-07-08"))
        assert np.isnan(close[gap]).all() and np.isfinite(close[x.dates == np.datetime64("2025-07-08")]).all()


def test_suspended_symbol_is_aligned_by_date_not_by_row(tmp_path):
    """Qlib's dump_update shifts values onto earlier dates after a suspension; we must not."""
    write(tmp_path / "a.csv", "symbol,date,close\nA,2024-01-02,10\nB,2024-01-02,20\n")
    # B is suspended on 01-03 and 01-04, trades again on 01-05.
    write(tmp_path / "b.csv", "symbol,date,close\nA,2024-01-03,11\nA,2024-01-04,12\nA,2024-01-05,13\n"
                              "B,2024-01-05,25\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    append(tmp_path / "s", [tmp_path / "b.csv"])
    st = open_store(tmp_path / "s")
    b = st.array("close")[st.symbol_index("B")]
    assert [str(d) for d in st.dates] == ["2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05"]
    assert b[0] == 20 and np.isnan(b[1]) and np.isnan(b[2]) and b[3] == 25


def test_revision_by_newer_snapshot(real, tmp_path):
    old_dir = real / "ashare_qfq_daily" / "data_20250903_with_amount"
    new_dir = real / "ashare_qfq_daily" / "data_20251009"
    ingest([old_dir], tmp_path / "s")
    amounts = int(np.isfinite(open_store(tmp_path / "s").array("amount")).sum())
    before = {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir() if p.is_file()}
    syms = sorted(p.stem for p in old_dir.glob("*.csv"))
    newer = [new_dir / f"{s}.csv" for s in syms if (new_dir / f"{s}.csv").exists()]
    dry = append(tmp_path / "s", newer, dry_run=True)
    assert dry.extra["mode"] == "dry run, would rewrite"
    assert {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir() if p.is_file()} == before
    rep = append(tmp_path / "s", newer)
    assert rep.extra["mode"] == "rewrite" and "600519" in rep.extra["revised cells"]
    st = open_store(tmp_path / "s", verify=True)
    # Every bar of the newer snapshot is now stored as given; amounts (absent there) are kept.
    ref = pl.read_csv(new_dir / "600519.csv", try_parse_dates=True)
    i = st.symbol_index("600519")
    pos = np.searchsorted(st.dates, ref["date"].to_numpy().astype("datetime64[D]"))
    assert np.array_equal(st.array("close")[i, pos], ref["close"].cast(pl.Float32).to_numpy())
    assert 0 < amounts == np.isfinite(st.array("amount")).sum()


def test_revision_dry_run_counts_changed_cells(tmp_path):
    write(tmp_path / "a.csv", "symbol,date,close,volume\nA,2024-01-02,10,1\nA,2024-01-03,11,1\nB,2024-01-02,5,1\n")
    write(tmp_path / "r.csv", "symbol,date,close,volume\nA,2024-01-02,10.5,1\nA,2024-01-03,11.5,2\nB,2024-01-02,5,1\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    rep = append(tmp_path / "s", [tmp_path / "r.csv"], dry_run=True)
    assert rep.extra["revised cells"] == "3 in 1 symbol(s): A 3"
    assert open_store(tmp_path / "s").array("close")[0, 0] == 10


def test_open_reader_keeps_its_snapshot(real, tmp_path):
    a, b, _ = split_inputs(real, tmp_path, "2025-06-03")
    ingest([a], tmp_path / "s")
    reader = open_store(tmp_path / "s")
    snap = np.array(reader.panel)
    n = reader.n_dates
    append(tmp_path / "s", [b])                                  # tail: in place beyond the reader's view
    assert reader.n_dates == n and np.array_equal(reader.panel, snap, equal_nan=True)
    write(tmp_path / "rev.csv", "symbol,date,close\n000001,2020-01-02,99\n")
    append(tmp_path / "s", [tmp_path / "rev.csv"])               # rewrite: a new generation
    assert np.array_equal(reader.panel, snap, equal_nan=True)
    assert open_store(tmp_path / "s").array("close")[0, 0] == 99
    reader.close()


APPEND = [sys.executable, "-m", "kline_store.cli", "append", "-q"]
POINTS = ["tail:grown", "tail:cleared", "tail:written", "commit:manifest-swapped", "commit:done"]
COMMITTED = ("commit:manifest-swapped", "commit:done")


def _files(store: Path) -> dict:
    m = json.loads((store / "manifest.json").read_text())
    return {"manifest": (store / "manifest.json").read_bytes(), "version": m["version"]}


@pytest.mark.parametrize("point", POINTS + ["rewrite:filled", "rewrite:data-in-place"])
def test_kill9_during_append_leaves_old_or_new(real, tmp_path, point):
    a, b, full = split_inputs(real, tmp_path, "2025-06-03")
    ingest([a], tmp_path / "s")
    before = _files(tmp_path / "s")
    if point.startswith("rewrite"):
        write(tmp_path / "rev.csv", "symbol,date,close\n000001,2020-01-02,99\n")
        target = [str(tmp_path / "rev.csv"), str(b)]
    else:
        target = [str(b)]
    r = subprocess.run(APPEND + [str(tmp_path / "s"), *target], capture_output=True,
                       env=dict(os.environ, KLINE_STORE_CRASH_AT=point))
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert verify_store(tmp_path / "s") == []
    after = _files(tmp_path / "s")
    assert after["version"] == before["version"] + (point in COMMITTED)
    if point not in COMMITTED:
        assert after["manifest"] == before["manifest"]
    assert open_store(tmp_path / "s", version=after["version"]).version == after["version"]
    append(tmp_path / "s", target)                                # the next append succeeds
    ingest([full], tmp_path / "ref")
    x = open_store(tmp_path / "s", verify=True)
    if point.startswith("rewrite"):
        assert x.array("close")[x.symbol_index("000001"), 0] == 99   # the revision landed, once
        assert x.n_dates == open_store(tmp_path / "ref").n_dates
    else:
        assert_same_store(x, open_store(tmp_path / "ref"))


def test_second_writer_fails_clearly_or_waits(tmp_path):
    write(tmp_path / "a.csv", "symbol,date,close\nA,2024-01-02,10\n")
    write(tmp_path / "b.csv", "symbol,date,close\nA,2024-01-03,11\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    held = WriterLock(tmp_path / "s").__enter__()
    with pytest.raises(StoreLockedError, match="store is locked by pid"):
        append(tmp_path / "s", [tmp_path / "b.csv"])
    r = subprocess.run(APPEND + [str(tmp_path / "s"), str(tmp_path / "b.csv")], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "locked by pid" in r.stderr
    threading.Timer(0.5, held.__exit__).start()
    append(tmp_path / "s", [tmp_path / "b.csv"], wait=20)
    assert open_store(tmp_path / "s").n_dates == 2


def test_concurrent_append_processes_never_corrupt(tmp_path):
    write(tmp_path / "a.csv", "symbol,date,close\nA,2024-01-02,10\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    procs = []
    for k in range(4):
        f = write(tmp_path / f"d{k}.csv", f"symbol,date,close\nS{k},2024-01-0{k + 3},{k}\n")
        procs.append(subprocess.Popen(APPEND + ["--wait", "60", str(tmp_path / "s"), str(f)]))
    assert [p.wait() for p in procs] == [0, 0, 0, 0]
    st = open_store(tmp_path / "s", verify=True)
    assert sorted(st.symbols) == ["A", "S0", "S1", "S2", "S3"] and st.n_dates == 5


def test_split_factor_from_events_continues_across_append(real, tmp_path):
    q = pl.read_csv(real / "zipline_csvdir" / "quandl_archive" / "QUANDL_SAMPLE_TABLE.csv", infer_schema_length=0)
    q = q.drop([c for c in q.columns if c.startswith("adj_")])          # events only: split_ratio, ex-dividend
    q.filter(pl.col("date") < "2014-06-01").write_csv(tmp_path / "a.csv")
    q.filter(pl.col("date") >= "2014-06-01").write_csv(tmp_path / "b.csv")
    q.write_csv(tmp_path / "all.csv")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    append(tmp_path / "s", [tmp_path / "b.csv"])
    ingest([tmp_path / "all.csv"], tmp_path / "ref")
    x, y = open_store(tmp_path / "s"), open_store(tmp_path / "ref")
    assert_same_store(x, y)
    f = x.array("adj_factor")[x.symbol_index("AAPL")]
    t = int(np.searchsorted(x.dates, np.datetime64("2014-06-09")))
    assert f[t] / f[t - 1] == pytest.approx(7.0, rel=1e-6)
    c = x.array("close")[x.symbol_index("AAPL")]
    assert c[t - 1] * f[t - 1] / f[t] == pytest.approx(645.57 / 7, rel=1e-5)   # forward-adjusted, continuous


@st.composite
def panels(draw):
    n_sym = draw(st.integers(1, 5))
    n_days = draw(st.integers(2, 30))
    rows = []
    for s in range(n_sym):
        for d in range(n_days):
            if draw(st.booleans()) or d == 0 and s == 0:
                rows.append((f"S{s}", d, draw(st.floats(0.5, 1e6, width=32)), draw(st.floats(0, 1e9, width=32))))
    cut = draw(st.integers(1, n_days - 1))
    return rows, cut


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(panels())
def test_property_append_equals_full_ingest(tmp_path_factory, case):
    rows, cut = case
    tmp = tmp_path_factory.mktemp("p")
    base = np.datetime64("2024-01-01")
    df = pl.DataFrame({"symbol": [r[0] for r in rows], "date": [str(base + r[1]) for r in rows],
                       "close": [r[2] for r in rows], "volume": [r[3] for r in rows]})
    first = df.filter(pl.col("date") < str(base + cut))
    second = df.filter(pl.col("date") >= str(base + cut))
    df.write_csv(tmp / "all.csv")
    ingest([tmp / "all.csv"], tmp / "ref")
    if first.height == 0 or second.height == 0:
        return
    first.write_csv(tmp / "a.csv")
    second.write_csv(tmp / "b.csv")
    ingest([tmp / "a.csv"], tmp / "s")
    append(tmp / "s", [tmp / "b.csv"])
    assert_same_store(open_store(tmp / "s", verify=True), open_store(tmp / "ref"))


def test_an_empty_cell_in_a_resent_bar_keeps_the_stored_value(tmp_path):
    write(tmp_path / "a.csv", "symbol,date,close,volume\nA,2024-01-02,10,500\nA,2024-01-03,11,600\n")
    write(tmp_path / "b.csv", "symbol,date,close,volume\nA,2024-01-03,11,\nA,2024-01-04,12,700\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    rep = append(tmp_path / "s", [tmp_path / "b.csv"])
    assert rep.extra["mode"] == "tail" and rep.extra["revised cells"].startswith("0 in 0")
    assert open_store(tmp_path / "s").array("volume")[0].tolist() == [500, 600, 700]


def test_events_appearing_in_an_append_give_the_same_factor_as_a_full_ingest(tmp_path):
    write(tmp_path / "a.csv", "symbol,date,close\nA,2024-01-02,70\nA,2024-01-03,71\n")
    write(tmp_path / "b.csv", "symbol,date,close,split\nA,2024-01-04,10.2,7\nA,2024-01-05,10.3,1\n")
    write(tmp_path / "all.csv", "symbol,date,close,split\nA,2024-01-02,70,\nA,2024-01-03,71,\n"
                                "A,2024-01-04,10.2,7\nA,2024-01-05,10.3,1\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    append(tmp_path / "s", [tmp_path / "b.csv"])
    ingest([tmp_path / "all.csv"], tmp_path / "ref")
    x, y = open_store(tmp_path / "s"), open_store(tmp_path / "ref")
    assert x.manifest["adj_factor_source"] == y.manifest["adj_factor_source"] == "events"
    assert_same_store(x, y)
    f = x.array("adj_factor")[0]
    assert f[2] / f[1] == pytest.approx(7.0)


def test_yahoo_factor_is_rebased_and_a_redownload_keeps_its_scale(tmp_path):
    """Yahoo's Adj Close is relative to the download day; stored factors start at 1 and keep ratios."""
    hdr = "Date,Open,High,Low,Close,Adj Close,Volume\n"
    # first download: a dividend after day 2 is not known yet; second download (later) rescales the past
    write(tmp_path / "old" / "X.csv", hdr + "2024-01-02,1,1,1,10,8,1\n2024-01-03,1,1,1,10,8,1\n")
    write(tmp_path / "new" / "X.csv", hdr + "2024-01-02,1,1,1,10,4,1\n2024-01-03,1,1,1,10,4,1\n"
                                          "2024-01-04,1,1,1,9,4.5,1\n")
    ingest([tmp_path / "old"], tmp_path / "s")
    assert open_store(tmp_path / "s").array("adj_factor")[0].tolist() == [1.0, 1.0]
    rep = append(tmp_path / "s", [tmp_path / "new"])
    # the vendor re-issued Adj Close (a revision of that field), but the factor's ratios did not change
    assert rep.extra["revised cells"] == "2 in 1 symbol(s): X 2"
    f = open_store(tmp_path / "s").array("adj_factor")[0]
    assert f.tolist() == pytest.approx([1.0, 1.0, 1.25])   # 4.5/9 over 4/10: the ratio survives


def test_resending_days_with_a_vendor_factor_is_no_revision(tmp_path):
    """tushare's adj_factor is absolute; stored rebased, a re-sent day must match it exactly, not by 1 ulp."""
    rows = [f"A,202401{d:02d},{10 + d * 0.37:.2f},{108.123 + d * 0.01:.3f}" for d in range(2, 22)]
    write(tmp_path / "a.csv", "ts_code,trade_date,close,adj_factor\n" + "\n".join(rows[:15]) + "\n")
    write(tmp_path / "b.csv", "ts_code,trade_date,close,adj_factor\n" + "\n".join(rows[5:]) + "\n")
    write(tmp_path / "all.csv", "ts_code,trade_date,close,adj_factor\n" + "\n".join(rows) + "\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    rep = append(tmp_path / "s", [tmp_path / "b.csv"])
    assert rep.extra["mode"] == "tail" and rep.extra["revised cells"].startswith("0 in 0")
    ingest([tmp_path / "all.csv"], tmp_path / "ref")
    x, y = open_store(tmp_path / "s"), open_store(tmp_path / "ref")
    np.testing.assert_allclose(x.array("adj_factor"), y.array("adj_factor"), rtol=1e-6)
    assert x.array("adj_factor")[0, 0] == 1.0


def test_a_dividend_after_a_bar_without_close_uses_the_last_close(tmp_path):
    write(tmp_path / "a.csv", "symbol,date,open,close,dividend\nA,2024-01-02,10,10,\nA,2024-01-03,10,10,\n"
                              "A,2024-01-04,10,,\n")
    write(tmp_path / "b.csv", "symbol,date,open,close,dividend\nA,2024-01-05,9,9,1\n")
    write(tmp_path / "all.csv", "symbol,date,open,close,dividend\nA,2024-01-02,10,10,\nA,2024-01-03,10,10,\n"
                                "A,2024-01-04,10,,\nA,2024-01-05,9,9,1\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s")
    append(tmp_path / "s", [tmp_path / "b.csv"])
    ingest([tmp_path / "all.csv"], tmp_path / "ref")
    assert_same_store(open_store(tmp_path / "s"), open_store(tmp_path / "ref"))
    assert open_store(tmp_path / "s").array("adj_factor")[0, 3] == pytest.approx(10 / 9)


def test_a_file_cut_mid_number_is_refused_and_the_stored_bar_kept(real, tmp_path):
    """Case 1: through append, `2017-09-01,164.800003,16` revised a stored high from 164.94 to 16.0, exit 0."""
    lines = (real / "us_yahoo_daily" / "AAPL.csv").read_text().splitlines()
    write(tmp_path / "full" / "AAPL.csv", "\n".join(lines) + "\n")
    ingest([tmp_path / "full"], tmp_path / "s")
    assert lines[-1].startswith("2017-09-01,164.800003,164.940002")
    write(tmp_path / "cut" / "AAPL.csv", "\n".join(lines[:-1] + ["2017-09-01,164.800003,16"]))
    before = (tmp_path / "s" / "manifest.json").read_bytes()
    r = subprocess.run(APPEND + [str(tmp_path / "s"), str(tmp_path / "cut")], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert f"AAPL.csv: line {len(lines)}: 3 fields, the header has 7" in r.stderr
    assert (tmp_path / "s" / "manifest.json").read_bytes() == before
    st = open_store(tmp_path / "s")
    assert st.array("high")[0, -1] == np.float32(164.940002)


# --- one calendar rule for ingest and append (issue 19) ------------------------------------------------------

def _outcome(fn):
    """('ok', None) or ('error', the error's class): what a user of ingest or append meets."""
    try:
        fn()
        return "ok"
    except InputError:
        return "error"


@st.composite
def session_inputs(draw):
    """Minute bars on two dates at times drawn in and around the A-share sessions (lunch, pre-open, after)."""
    times = st.sampled_from(["08:01", "09:31", "09:32", "11:30", "12:00", "13:01", "14:59", "15:00", "15:30"])
    day1 = sorted(set(draw(st.lists(times, min_size=1, max_size=4))))
    day2 = sorted(set(draw(st.lists(times, min_size=1, max_size=4))))
    return day1, day2


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(session_inputs())
def test_append_applies_the_sessions_as_ingest_does(tmp_path_factory, case):
    day1, day2 = case
    tmp = tmp_path_factory.mktemp("sess")
    head = "".join(f"X,2024-01-02 {t},{i + 1}\n" for i, t in enumerate(day1))
    tail = "".join(f"X,2024-01-03 {t},{i + 1}\n" for i, t in enumerate(day2))
    write(tmp / "a.csv", "symbol,dt,close\n" + head)
    write(tmp / "b.csv", "symbol,dt,close\n" + tail)
    write(tmp / "all.csv", "symbol,dt,close\n" + head + tail)
    full = _outcome(lambda: ingest([tmp / "all.csv"], tmp / "ref", sessions="ashare", freq="1min"))
    if _outcome(lambda: ingest([tmp / "a.csv"], tmp / "s", sessions="ashare", freq="1min")) == "error":
        assert full == "error"
        return
    appended = _outcome(lambda: append(tmp / "s", [tmp / "b.csv"]))
    assert appended == full, (day1, day2)
    if full == "ok":
        assert_same_store(open_store(tmp / "s", verify=True), open_store(tmp / "ref"))


@pytest.mark.parametrize("stamp", ["2024-01-02 12:00", "2024-01-03 08:01"])
def test_append_of_a_bar_outside_the_sessions_names_file_line_and_stamp(tmp_path, stamp):
    write(tmp_path / "a.csv", "dt,close\n2024-01-02 09:31,1\n2024-01-02 09:32,2\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s", sessions="ashare")
    write(tmp_path / "b.csv", f"dt,close\n2024-01-02 09:33,3\n{stamp},4\n")
    with pytest.raises(InputError, match=rf"b.csv line 3: .*bar at {stamp} is outside the store's sessions"):
        append(tmp_path / "s", [tmp_path / "b.csv"])
    assert open_store(tmp_path / "s").n_dates == 2


def test_append_keeps_to_the_calendar_file_of_the_store(tmp_path):
    cal = write(tmp_path / "cal.csv", "date\n2024-01-02\n2024-01-03\n2024-01-04\n")   # Tue..Thu
    write(tmp_path / "a.csv", "symbol,date,close\nX,2024-01-02,1\nX,2024-01-03,2\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s", calendar=str(cal))
    sat = write(tmp_path / "sat.csv", "symbol,date,close\nX,2024-01-04,3\nX,2024-01-06,4\n")
    with pytest.raises(InputError, match=r"sat.csv line 3: .*2024-01-06 is outside the store's calendar \(.*cal.csv"):
        append(tmp_path / "s", [sat])
    new = write(tmp_path / "new.csv", "symbol,date,close\nX,2024-01-05,5\n")
    with pytest.raises(InputError, match=r"new.csv line 2: .*2024-01-05 is outside .*pass --calendar FILE"):
        append(tmp_path / "s", [new])
    r = run_cli("append", str(tmp_path / "s"), str(new))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "--calendar" in r.stderr
    cal2 = write(tmp_path / "cal2.csv", "date\n2024-01-02\n2024-01-03\n2024-01-04\n2024-01-05\n")
    append(tmp_path / "s", [new], calendar=str(cal2))
    write(tmp_path / "all.csv", "symbol,date,close\nX,2024-01-02,1\nX,2024-01-03,2\nX,2024-01-05,5\n")
    ingest([tmp_path / "all.csv"], tmp_path / "ref", calendar=str(cal2))
    assert_same_store(open_store(tmp_path / "s", verify=True), open_store(tmp_path / "ref"))
    assert open_store(tmp_path / "s").manifest["calendar_source"] == str(cal2)


def test_a_calendar_fifo_and_a_lack_of_file_descriptors_are_one_line(tmp_path):
    """Issue 19: a calendar FIFO hung the read; `ulimit -n 8` was "unexpected OSError"."""
    fifo = tmp_path / "cal.csv"
    os.mkfifo(fifo)
    a = write(tmp_path / "a.csv", "symbol,date,close\nX,2024-01-02,1\n")
    r = run_cli("ingest", str(a), "-o", str(tmp_path / "s"), "--calendar", str(fifo), timeout=60)
    assert r.returncode == 1 and "cal.csv: not a regular file" in r.stderr
    ingest([a], tmp_path / "s")
    b = write(tmp_path / "b.csv", "symbol,date,close\nX,2024-01-03,2\n")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (8, 8)); "
            "from kline_store.cli.main import main; sys.argv = ['kline-store', 'append', sys.argv[1], sys.argv[2]]; main()")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s"), str(b)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "too many open files (this process may open 8" in r.stderr and "unexpected" not in r.stderr
