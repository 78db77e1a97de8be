"""End-to-end ingest on the real files, validation errors, and atomicity (kill -9 included)."""

import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import write
from kline_store import ingest, open_store, verify_store
from kline_store.errors import InputError, StoreError

FOLDERS = ["tushare_daily", "akshare_sina_daily", "index_with_time", "us_yahoo_daily", "yahoo_mplfinance",
           "zipline_csvdir", "ashare_qfq_daily/data_20251009", "ashare_qfq_daily/data_20250903_with_amount"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_real_folder_ingests_and_round_trips(real, tmp_path, folder):
    rep = ingest([real / folder], tmp_path / "s")
    st = open_store(tmp_path / "s", verify=True)
    assert st.n_symbols == rep.n_symbols > 0 and st.n_dates == rep.n_dates
    assert list(st.dates) == sorted(set(st.dates))
    # Every stored bar equals float32 of its source value: check one file's close column cell by cell.
    f = sorted(p for p in (real / folder).rglob("*.csv"))[0]
    src = pl.read_csv(f, infer_schema_length=0)
    close_col = next(c for c in src.columns if c.lower() in ("close", "收盘"))
    date_col = next(c for c in src.columns if c.lower() in ("date", "trade_date", "dt", "day"))
    sym_col = next((c for c in src.columns if c.lower() in ("ts_code", "symbol", "ticker")), None)
    row = src.row(len(src) // 2, named=True)
    sym = row[sym_col] if sym_col else f.name[:-4]
    d = row[date_col][:10]
    d = f"{d[:4]}-{d[4:6]}-{d[6:8]}" if len(d) == 8 and d.isdigit() else d
    if "/" in d:
        d = datetime.datetime.strptime(d, "%m/%d/%Y").date().isoformat()
    t = int(np.searchsorted(st.dates, np.datetime64(d)))
    assert st.array("close")[st.symbol_index(sym), t] == np.float32(float(row[close_col]))


def test_suspension_listing_delisting_are_nan_with_extents(real, tmp_path):
    folder = real / "ashare_qfq_daily" / "data_20251009"
    ingest([folder / "000670.csv", folder / "000627.csv", folder / "000001.csv"], tmp_path / "s")
    st = open_store(tmp_path / "s")
    close = st.array("close")
    i = st.symbol_index("000670")
    gap = (st.dates > np.datetime64("2020-03-19")) & (st.dates < np.datetime64("2022-08-22"))
    assert gap.sum() > 300 and np.isnan(close[i, gap]).all()
    assert np.isfinite(close[i, st.dates == np.datetime64("2022-08-22")]).all()
    j = st.symbol_index("000627")
    assert str(st.dates[st.last_bar[j]]) == "2025-08-13"
    assert np.isnan(close[j, st.last_bar[j] + 1:]).all()
    m = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert m["last_date"][j] == "2025-08-13"
    assert {"format_version", "shape", "dtype", "fields", "symbols", "calendar", "data", "sources",
            "created_at", "first_bar", "last_bar"} <= set(m)


def test_tushare_newest_first_and_integer_dates(real, tmp_path):
    ingest([real / "tushare_daily" / "000858.SZ.csv"], tmp_path / "s")
    st = open_store(tmp_path / "s")
    assert st.dates[0] == np.datetime64("2020-01-02")
    t = int(np.searchsorted(st.dates, np.datetime64("2020-02-03")))
    o, h, lo, c = (st.array(f)[0, t] for f in ("open", "high", "low", "close"))
    assert o == h == lo == c                       # the limit-down bar, kept as is


def test_long_and_parquet_inputs_together(real, tmp_path):
    pq = tmp_path / "in.parquet"
    pl.read_csv(real / "index_with_time" / "000001.SH_D.csv").write_parquet(pq)
    rep = ingest([pq, real / "tushare_daily" / "000001.SZ.csv"], tmp_path / "s")
    assert rep.n_symbols == 2 and open_store(tmp_path / "s").symbols == ["000001.SH", "000001.SZ"]


def test_calendar_file_and_bars_outside_it(tmp_path):
    write(tmp_path / "a.csv", "date,close\n2024-01-02,1\n2024-01-04,2\n")
    cal = write(tmp_path / "cal.csv", "date\n2024-01-02\n2024-01-03\n2024-01-04\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s", calendar=str(cal))
    st = open_store(tmp_path / "s")
    assert st.n_dates == 3 and np.isnan(st.array("close")[0, 1])
    short = write(tmp_path / "cal2.csv", "date\n2024-01-02\n")
    with pytest.raises(InputError, match=r"1 bar\(s\) at 1 date\(s\) not in the calendar \(2024-01-04\)"):
        ingest([tmp_path / "a.csv"], tmp_path / "s2", calendar=str(short))


def test_duplicate_bar_names_symbol_date_files(tmp_path):
    write(tmp_path / "a.csv", "symbol,date,close\nX,2024-01-02,1\nX,2024-01-03,1\n")
    write(tmp_path / "b.csv", "symbol,date,close\nX,2024-01-03,2\n")
    with pytest.raises(InputError) as e:
        ingest([tmp_path / "a.csv", tmp_path / "b.csv"], tmp_path / "s")
    msg = str(e.value)
    assert "duplicate bar: symbol X date 2024-01-03" in msg and "a.csv line 3" in msg and "b.csv line 2" in msg
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_quality_warnings_and_strict(real, tmp_path):
    f = real / "yahoo_mplfinance" / "yahoofinance-SPY-20080101-20180101.csv"
    rep = ingest([f], tmp_path / "s")
    kinds = {p.kind: p for p in rep.problems}
    assert kinds["open_outside_range"].count == 2 and "2015-03-05" in kinds["open_outside_range"].examples[0]
    with pytest.raises(InputError, match="--strict: open_outside_range"):
        ingest([f], tmp_path / "s2", strict=True)
    zero = ingest([real / "us_yahoo_daily" / "AGFS.csv"], tmp_path / "s3")
    assert {p.kind for p in zero.problems} >= {"zero_volume"}


def test_all_null_row_is_no_bar(real, tmp_path):
    rep = ingest([real / "us_yahoo_daily" / "PTR.csv"], tmp_path / "s")
    st = open_store(tmp_path / "s")
    assert rep.skipped_empty == 1
    assert np.datetime64("2016-06-29") not in set(st.dates)   # nobody traded that day in this input


def _digest(store: Path) -> dict:
    m = json.loads((store / "manifest.json").read_text())
    files = [store / "manifest.json", store / m["data"]["file"]]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_failed_ingest_leaves_existing_store_intact(real, tmp_path):
    ingest([real / "tushare_daily"], tmp_path / "s")
    before = _digest(tmp_path / "s")
    write(tmp_path / "bad.csv", "date,close\n2024-01-02,x\n")
    with pytest.raises(InputError):
        ingest([tmp_path / "bad.csv"], tmp_path / "s", replace=True)
    assert _digest(tmp_path / "s") == before and verify_store(tmp_path / "s") == []
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".lock", "data-g000001.f32", "manifest.json",
                                                                  "versions"]   # no staging left behind


def test_refuses_to_overwrite_a_non_store_folder(tmp_path):
    write(tmp_path / "notes" / "x.txt", "mine")
    write(tmp_path / "a.csv", "date,close\n2024-01-02,1\n")
    for replace in (False, True):
        with pytest.raises(InputError, match="not empty and holds no store"):
            ingest([tmp_path / "a.csv"], tmp_path / "notes", replace=replace)
        assert [p.name for p in (tmp_path / "notes").iterdir()] == ["x.txt"]   # not even a .lock left there


INGEST = [sys.executable, "-m", "kline_store.cli", "ingest", "-q", "--replace"]


@pytest.mark.parametrize("point", ["ingest:filled", "ingest:data-in-place"])
def test_kill9_at_each_point_keeps_old_store(real, tmp_path, point):
    ingest([real / "tushare_daily" / "000001.SZ.csv"], tmp_path / "s")
    before = _digest(tmp_path / "s")
    env = dict(os.environ, KLINE_STORE_CRASH_AT=point)
    r = subprocess.run(INGEST + [str(real / "tushare_daily"), "-o", str(tmp_path / "s")], env=env,
                       capture_output=True)
    assert r.returncode == -signal.SIGKILL
    assert _digest(tmp_path / "s") == before and verify_store(tmp_path / "s") == []
    ingest([real / "tushare_daily"], tmp_path / "s", replace=True)   # the next writer recovers
    assert open_store(tmp_path / "s").n_symbols == 10 and verify_store(tmp_path / "s") == []


def test_kill9_right_after_the_manifest_swap_is_the_new_version(real, tmp_path):
    ingest([real / "tushare_daily" / "000001.SZ.csv"], tmp_path / "s")
    env = dict(os.environ, KLINE_STORE_CRASH_AT="commit:manifest-swapped")
    r = subprocess.run(INGEST + [str(real / "tushare_daily"), "-o", str(tmp_path / "s")], env=env,
                       capture_output=True)
    assert r.returncode == -signal.SIGKILL and verify_store(tmp_path / "s") == []
    st = open_store(tmp_path / "s")
    assert st.n_symbols == 10 and open_store(tmp_path / "s", version=st.version).n_symbols == 10
    assert (tmp_path / "s" / "versions" / f"v{st.version:06d}.json").exists()   # the reader restored the copy
    with pytest.raises(StoreError, match="not available"):
        open_store(tmp_path / "s", version=st.version + 1)


def test_kill9_at_random_moments(real, tmp_path):
    ingest([real / "tushare_daily" / "000001.SZ.csv"], tmp_path / "s")
    before = _digest(tmp_path / "s")
    for delay in (0.05, 0.2, 0.4, 0.6, 0.9):
        p = subprocess.Popen(INGEST + [str(real / "us_yahoo_daily"), "-o", str(tmp_path / "s")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert verify_store(tmp_path / "s") == []
        now = _digest(tmp_path / "s")
        if now != before:        # the ingest finished before the kill: the new store, complete
            assert open_store(tmp_path / "s").n_symbols == 88
            break


def test_existing_store_needs_replace(real, tmp_path):
    ingest([real / "tushare_daily"], tmp_path / "s")
    with pytest.raises(InputError, match="a store is already there; `kline-store append`"):
        ingest([real / "tushare_daily" / "000001.SZ.csv"], tmp_path / "s")
    assert open_store(tmp_path / "s").n_symbols == 10
    ingest([real / "tushare_daily" / "000001.SZ.csv"], tmp_path / "s", replace=True)
    assert open_store(tmp_path / "s").n_symbols == 1


def test_killed_or_failed_first_ingest_can_be_retried(real, tmp_path):
    env = dict(os.environ, KLINE_STORE_CRASH_AT="ingest:data-in-place")
    r = subprocess.run(INGEST + [str(real / "tushare_daily"), "-o", str(tmp_path / "s")], env=env,
                       capture_output=True)
    assert r.returncode == -signal.SIGKILL and not (tmp_path / "s" / "manifest.json").exists()
    ingest([real / "tushare_daily"], tmp_path / "s")           # leftovers of our own are not "a folder"
    assert open_store(tmp_path / "s").n_symbols == 10
    (tmp_path / "e").mkdir()
    write(tmp_path / "dup.csv", "symbol,date,close\nA,2024-01-02,1\nA,2024-01-02,2\n")
    with pytest.raises(InputError, match="duplicate"):
        ingest([tmp_path / "dup.csv"], tmp_path / "e")
    assert [p.name for p in (tmp_path / "e").iterdir()] in ([], [".lock"])   # no spill, no staging


def test_locked_out_ingest_leaves_the_holder_alone(tmp_path):
    from kline_store.errors import StoreLockedError
    from kline_store.store.lock import WriterLock
    write(tmp_path / "a.csv", "date,close\n2024-01-02,1\n")
    with WriterLock(tmp_path / "s", create=True):
        (tmp_path / "s" / ".staging").mkdir()
        (tmp_path / "s" / ".staging" / "work").write_text("the holder's")
        with pytest.raises(StoreLockedError):
            ingest([tmp_path / "a.csv"], tmp_path / "s")
        assert (tmp_path / "s" / ".staging" / "work").read_text() == "the holder's"


def test_tushare_trade_cal_keeps_open_days_only(tmp_path):
    write(tmp_path / "a.csv", "date,close\n2024-01-02,1\n2024-01-04,2\n")
    cal = write(tmp_path / "trade_cal.csv", "exchange,cal_date,is_open,pretrade_date\nSSE,20240101,0,20231229\n"
                "SSE,20240102,1,20231229\nSSE,20240103,1,20240102\nSSE,20240104,1,20240103\nSSE,20240106,0,20240104\n")
    ingest([tmp_path / "a.csv"], tmp_path / "s", calendar=str(cal))
    assert [str(d) for d in open_store(tmp_path / "s").dates] == ["2024-01-02", "2024-01-03", "2024-01-04"]


def test_map_of_a_missing_column_is_an_error(tmp_path):
    write(tmp_path / "a.csv", "date,close\n2024-01-02,1\n")
    with pytest.raises(InputError, match="--map nosuch: no such column in any input"):
        ingest([tmp_path / "a.csv"], tmp_path / "s", map=["nosuch=close"])


def test_symbol_pattern_in_file_names(real, tmp_path):
    files = sorted((real / "yahoo_mplfinance").glob("yahoofinance-*.csv"))
    rep = ingest(files, tmp_path / "s", symbol_pattern=r"yahoofinance-(\w+)-")
    assert open_store(tmp_path / "s").symbols == ["AAPL", "GOOG", "INTC", "SPY"]   # SPY's two files join
    assert rep.n_bars == sum(1 for f in files for _ in open(f)) - len(files)
    with pytest.raises(InputError, match="--symbol-pattern 'zzz' does not match the file name"):
        ingest(files[:1], tmp_path / "t", symbol_pattern="zzz")


def test_a_failed_first_ingest_leaves_no_folder(tmp_path):
    """Case 8: a failed first ingest left an empty folder behind."""
    write(tmp_path / "bad.csv", "date,close\n2024-01-02,1\n2024-01-03,x\n")
    with pytest.raises(InputError, match="line 3: column 'close': non-numeric value 'x'"):
        ingest([tmp_path / "bad.csv"], tmp_path / "new" / "s")
    assert not (tmp_path / "new").exists()                 # nor the parent it made for it
    (tmp_path / "kept").mkdir()
    with pytest.raises(InputError):
        ingest([tmp_path / "bad.csv"], tmp_path / "kept" / "s")
    assert list((tmp_path / "kept").iterdir()) == []


def test_two_ingests_into_one_place_cannot_both_win(real, tmp_path):
    """Case 5: the "a store is already there" check ran before the lock, so `ingest A -o R --wait 60 &
    ingest B -o R --wait 60` both exited 0 and the first store was gone."""
    from kline_store.store.lock import WriterLock
    target = tmp_path / "R"
    held = WriterLock(target, create=True).__enter__()     # both start while the place is busy and empty
    procs = [subprocess.Popen([sys.executable, "-m", "kline_store.cli", "ingest", "-q", "--wait", "60",
                               str(real / "tushare_daily" / f), "-o", str(target)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in ("000001.SZ.csv", "600519.SH.csv")]
    time.sleep(2)                                           # let both get as far as they go before the lock
    held.__exit__()
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    assert sorted(rc for rc, _ in results) == [0, 1], results
    loser = next(err for rc, err in results if rc == 1)
    assert "a store is already there" in loser and loser.count("\n") == 1
    winner = next(i for i, (rc, _) in enumerate(results) if rc == 0)
    assert open_store(target).symbols == [["000001.SZ", "600519.SH"][winner]]
    assert open_store(target).version == 1


def test_the_api_takes_one_path_or_a_list_and_refuses_other_types(tmp_path):
    """ingest("a.csv", ...) once iterated the string one character at a time ('c: no such file')."""
    from kline_store import append, open_store
    a = write(tmp_path / "a.csv", "date,close\n2024-01-02,1\n")
    assert ingest(str(a), tmp_path / "s").n_bars == 1
    assert append(tmp_path / "s", a, dry_run=True).extra["mode"] == "dry run: nothing new"
    for inputs in (None, 3, [a, None]):
        with pytest.raises(InputError, match="expected a path|no input"):
            ingest(inputs, tmp_path / "t")
    with pytest.raises(StoreError, match="expected a store directory path"):
        open_store(None)
