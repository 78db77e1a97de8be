"""Stamps said, not guessed (issue 25 part 4): `resample --stamp start|end` (start-stamped minute bars make
5-minute periods labelled by their start, 16:00 not 16:04, equal to pandas' left-labelled resample), and a UTC
conversion that moves daily bars to another date reported with the count and an example."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import run_cli, write
from kline_store import append, ingest, open_store
from kline_store.errors import InputError
from kline_store.ingest.resample import resample


def start_stamped(path):
    rng = np.random.default_rng(4)
    t = pd.date_range("2024-01-02 09:30", "2024-01-02 15:59", freq="min").append(
        pd.date_range("2024-01-03 09:30", "2024-01-03 15:59", freq="min"))
    c = np.round(100 + np.cumsum(rng.normal(0, 0.05, len(t))), 2)
    df = pd.DataFrame({"datetime": t.strftime("%Y-%m-%d %H:%M"), "open": np.round(c + 0.01, 2), "high": c + 0.05,
                       "low": c - 0.05, "close": c, "volume": rng.integers(100, 1000, len(t))})
    df.to_csv(path, index=False)
    return df


def test_resample_start_stamped_minutes_labels_periods_by_their_start(tmp_path):
    df = start_stamped(tmp_path / "spy.csv")
    ingest([tmp_path / "spy.csv"], tmp_path / "m1")
    r = run_cli("resample", str(tmp_path / "m1"), "-o", str(tmp_path / "m5"), "--freq", "5min", "--stamp", "start")
    assert r.returncode == 0, r.stderr
    st = open_store(tmp_path / "m5")
    src = df.assign(datetime=pd.to_datetime(df["datetime"])).set_index("datetime")
    want = src.resample("5min", label="left", closed="left").agg(
        {"open": "first", "high": "max", "low": "min", "close": "last", "volume": "sum"}).dropna()
    assert [str(d) for d in st.dates] == [t.strftime("%Y-%m-%dT%H:%M") for t in want.index]
    assert "2024-01-02T16:00" not in [str(d) for d in st.dates] and str(st.dates[0]) == "2024-01-02T09:30"
    for f in ("open", "high", "low", "close", "volume"):
        assert np.array_equal(st.array(f)[0], want[f].to_numpy(np.float32)), f
    assert st.manifest.get("stamp") == "start"
    resample(tmp_path / "m5", tmp_path / "m15", "15min")          # the store's own stamp, recorded
    assert str(open_store(tmp_path / "m15").dates[0]) == "2024-01-02T09:30"
    end = resample(tmp_path / "m1", tmp_path / "e5", "5min")          # default: end-stamped, as before
    assert str(open_store(tmp_path / "e5").dates[0]) == "2024-01-02T09:34" and end.n_periods == len(want)


def test_stamp_against_the_store_template_is_refused(tmp_path):
    write(tmp_path / "a.csv", "dt,close\n" + "".join(f"2024-01-02 09:{m},1\n" for m in range(31, 60)))
    ingest([tmp_path / "a.csv"], tmp_path / "s", sessions="ashare")
    with pytest.raises(InputError, match="--stamp start: .* stamps its bars with their end"):
        resample(tmp_path / "s", tmp_path / "o", "5min", stamp="start")


def test_a_utc_conversion_that_moves_daily_bars_is_reported(tmp_path):
    days = ["2000-01-04", "2000-01-05", "2000-01-06", "2000-01-07"]
    p = write(tmp_path / "jp.csv", "date,close\n" + "".join(f"{d} 00:00:00+09:00,{i + 1}\n" for i, d in enumerate(days)))
    r = run_cli("ingest", str(p), "-o", str(tmp_path / "utc"), "--timezone", "UTC")
    assert r.returncode == 0, r.stderr
    note = next(ln for ln in r.stdout.splitlines() if ln.startswith("note --timezone UTC"))
    assert "4 bar(s) stored on another date than written" in note
    assert "'2000-01-04 00:00:00+09:00' (" in note and "jp.csv: line 2) is 2000-01-03 15:00 there" in note
    assert [str(d) for d in open_store(tmp_path / "utc").dates] == ["2000-01-03", "2000-01-04", "2000-01-05",
                                                                     "2000-01-06"]
    plain = ingest([p], tmp_path / "wall")              # no --timezone: the written dates, no note
    assert [str(d) for d in open_store(tmp_path / "wall").dates] == days and not plain.notes
    tokyo = ingest([p], tmp_path / "tokyo", timezone="Asia/Tokyo")   # converted to the same clock: nothing moves
    assert not tokyo.notes
    nxt = write(tmp_path / "next.csv", "date,close\n2000-01-11 00:00:00+09:00,5\n2000-01-12 00:00:00+09:00,6\n")
    rep = append(tmp_path / "utc", [nxt])
    assert any("2 bar(s) stored on another date" in n for n in rep.notes)
    assert any(ln.startswith("note --timezone UTC") for ln in rep.lines())


def test_an_intraday_conversion_is_not_a_moved_date(tmp_path):
    p = write(tmp_path / "m.csv", "dt,close\n" + "".join(f"2024-01-02 08:{m}:00+09:00,1\n" for m in range(30, 40)))
    rep = ingest([p], tmp_path / "s", timezone="UTC")
    assert open_store(tmp_path / "s").freq == "1min" and not rep.notes


def test_a_zone_aware_column_moved_by_the_conversion_is_reported(tmp_path):
    idx = pd.date_range("2000-01-04", periods=3, freq="D", tz="Asia/Tokyo")
    df = pd.DataFrame({"close": [1.0, 2.0, 3.0]}, index=idx)
    rep = ingest(df, tmp_path / "utc", symbol="X", timezone="UTC")
    note = next(n for n in rep.notes if n.startswith("--timezone UTC"))
    assert note.startswith("--timezone UTC: 3 bar(s) stored on another date than written")
    assert "'2000-01-04 00:00:00 Asia/Tokyo' (DataFrame row 1) is 2000-01-03 15:00 there" in note
    assert [str(d) for d in open_store(tmp_path / "utc").dates] == ["2000-01-03", "2000-01-04", "2000-01-05"]
    df.rename_axis("date").reset_index().to_parquet(tmp_path / "jp.parquet")
    rep = ingest([tmp_path / "jp.parquet"], tmp_path / "pq", timezone="UTC")
    assert any("jp.parquet row 1" in n for n in rep.notes)
    assert not ingest(df, tmp_path / "tokyo", symbol="X", timezone="Asia/Tokyo").notes
