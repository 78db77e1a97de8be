"""Stamps said, not guessed (issue 26 part 6): an empty or partial Time cell in a Date,Time minute file refused
naming file and line (or left out and counted with --skip-bad), a fraction of a second refused or rounded only
with --round-stamps, and a DataFrame of stamps in two time zones given the mixed-offsets message (or converted
with timezone=)."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli, write
from kline_store import append, ingest, open_store
from kline_store.errors import InputError


def minute_file(path, times, day="2024-01-02"):
    rows = "".join(f"{day},{t},{10 + i / 100:.2f},{100 + i}\n" for i, t in enumerate(times))
    return write(path, "Date,Time,Close,Volume\n" + rows)


TIMES = [f"09:{m:02d}" for m in range(31, 41)]


def refusal(args, *needles):
    r = run_cli(*args)
    err = r.stderr.strip()
    assert r.returncode == 1 and "\n" not in err and "Traceback" not in err, r.stderr
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("cell", ["", "NA", "9", "31", "09:3"])
def test_an_empty_or_partial_time_cell_is_refused_naming_the_line(tmp_path, cell):
    times = TIMES[:4] + [cell] + TIMES[5:]
    p = minute_file(tmp_path / "m.csv", times)
    refusal(["ingest", str(p), "-o", str(tmp_path / "s")], "m.csv: line 6", "Time")
    assert not (tmp_path / "s").exists()


def test_empty_time_cells_are_left_out_and_counted_with_skip_bad(tmp_path):
    times = TIMES[:4] + ["", ""] + TIMES[6:]
    p = minute_file(tmp_path / "m.csv", times)
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "s"), "--skip-bad")
    assert r.returncode == 0, r.stderr
    assert "left out 2 row(s) whose time of day is empty (--skip-bad), first" in r.stdout and "line 6" in r.stdout
    st = open_store(tmp_path / "s")
    src = pd.read_csv(p, keep_default_na=False)
    src = src[src["Time"] != ""]
    assert st.freq == "1min" and [str(d)[11:] for d in st.dates] == src["Time"].tolist()
    assert np.array_equal(st.array("close")[0], src["Close"].to_numpy(np.float32))
    assert "00:00" not in " ".join(str(d) for d in st.dates)


def test_a_daily_file_with_an_empty_time_column_stays_daily(tmp_path):
    p = write(tmp_path / "d.csv", "Date,Time,Close\n2024-01-02,,1\n2024-01-03,,2\n2024-01-04,,3\n")
    ingest([p], tmp_path / "s")
    assert open_store(tmp_path / "s").freq == "1d"


@pytest.mark.parametrize("joined", [False, True])
def test_a_fraction_of_a_second_is_refused_or_rounded_with_the_flag(tmp_path, joined):
    times = [t + ":00" for t in TIMES]
    times[3] = "09:34:00.5"
    if joined:
        p = write(tmp_path / "m.csv", "dt,close\n" + "".join(f"2024-01-02 {t},{i}\n" for i, t in enumerate(times)))
    else:
        p = minute_file(tmp_path / "m.csv", times)
    refusal(["ingest", str(p), "-o", str(tmp_path / "s")], "m.csv: line 5", "09:34:00.5", "--round-stamps")
    assert not (tmp_path / "s").exists()
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "s"), "--round-stamps")
    assert r.returncode == 0, r.stderr
    st = open_store(tmp_path / "s")
    assert [str(d)[11:] for d in st.dates] == TIMES


def test_rounding_applies_to_appends_too(tmp_path):
    ingest([minute_file(tmp_path / "a.csv", TIMES)], tmp_path / "s")
    b = minute_file(tmp_path / "b.csv", ["09:31:00.4", "09:31:59.6"], day="2024-01-03")
    before = hashlib.sha256((tmp_path / "s" / "manifest.json").read_bytes()).hexdigest()
    with pytest.raises(InputError, match="has seconds"):
        append(tmp_path / "s", [b])
    assert hashlib.sha256((tmp_path / "s" / "manifest.json").read_bytes()).hexdigest() == before
    append(tmp_path / "s", [b], round_stamps=True)
    assert [str(d) for d in open_store(tmp_path / "s").dates[-2:]] == ["2024-01-03T09:31", "2024-01-03T09:32"]


def test_a_dataframe_of_two_time_zones(tmp_path):
    sh = [pd.Timestamp(f"2024-01-02 09:3{i}", tz="Asia/Shanghai") for i in range(1, 4)]
    ny = pd.Timestamp("2024-01-02 09:31", tz="America/New_York")
    df = pd.DataFrame({"date": sh + [ny], "close": [1.0, 2.0, 3.0, 4.0]})
    with pytest.raises(InputError, match=r"DataFrame: stamps with different UTC offsets in column 'date': "
                                         r"'2024-01-02 09:31:00\+08:00' \(row 1\) and '2024-01-02 09:31:00-05:00' "
                                         r"\(row 4\); pass timezone="):
        ingest(df, tmp_path / "s", symbol="X")
    assert not (tmp_path / "s").exists()
    ingest(df, tmp_path / "s", symbol="X", timezone="Asia/Shanghai")
    st = open_store(tmp_path / "s")
    want = pd.to_datetime(df["date"], utc=True).dt.tz_convert("Asia/Shanghai").dt.tz_localize(None)
    assert [str(d) for d in st.dates] == [t.strftime("%Y-%m-%dT%H:%M") for t in sorted(want)]
    one = pd.DataFrame({"date": pd.date_range("2024-03-08", periods=4, freq="D", tz="America/New_York").astype(object),
                        "close": [1.0, 2.0, 3.0, 4.0]})   # one zone across a DST change: one clock
    ingest(one, tmp_path / "ny", symbol="X")
    assert open_store(tmp_path / "ny").n_dates == 4
