"""Exchange calendars through the optional exchange_calendars library: --calendar XSHG/XNYS on real daily files
(holidays), --sessions XSHG on the real minute file (lunch break), an XNYS early close; one line without it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import write
from kline_store import ingest, open_store
from kline_store.errors import InputError

try:
    import exchange_calendars  # noqa: F401
    HAVE = True
except ImportError:
    HAVE = False
need = pytest.mark.skipif(not HAVE, reason="exchange_calendars is not installed (pip install 'kline-store[calendars]')")


@need
def test_xshg_daily_calendar_is_the_a_share_trading_days(real, tmp_path):
    files = sorted((real / "tushare_daily").glob("*.csv"))
    ingest(files, tmp_path / "x", calendar="XSHG")
    ingest(files, tmp_path / "u")
    x, u = open_store(tmp_path / "x"), open_store(tmp_path / "u")
    assert np.array_equal(x.dates, u.dates)                 # 10 symbols traded on every session
    days = set(map(str, x.dates))
    assert not {f"2024-10-0{d}" for d in range(1, 8)} & days and "2024-10-08" in days   # National Day
    np.testing.assert_array_equal(x.panel, u.panel)
    assert x.manifest["calendar_source"] == "XSHG"


@need
def test_xnys_daily_calendar_knows_hurricane_sandy(real, tmp_path):
    f = real / "us_yahoo_daily" / "AAPL.csv"
    ingest([f], tmp_path / "x", calendar="XNYS")
    st = open_store(tmp_path / "x")
    days = set(map(str, st.dates))
    assert "2012-10-29" not in days and "2012-10-30" not in days and "2012-10-31" in days
    assert st.n_dates == 1258 and np.isfinite(st.array("close")).all()


@need
def test_xshg_sessions_equal_the_a_share_template(real, tmp_path):
    f = real / "intraday_ashare_1min" / "000001.XSHG_1MIN.csv"
    ingest([f], tmp_path / "x", sessions="XSHG")
    ingest([f], tmp_path / "a", sessions="ashare")
    x, a = open_store(tmp_path / "x"), open_store(tmp_path / "a")
    assert np.array_equal(x.dates, a.dates) and x.n_dates == 11 * 240
    np.testing.assert_array_equal(x.panel, a.panel)
    assert x.manifest["exchange"] == "XSHG" and x.manifest["sessions"]["intervals"] == [["09:30", "11:30"],
                                                                                        ["13:00", "15:00"]]
    stamps = x.dates[:241].astype(str)
    assert stamps[119].endswith("11:30") and stamps[120].endswith("13:01")   # the lunch break has no bar


def _minutes(day: str, last: str) -> list[str]:
    t = np.arange(np.datetime64(f"{day}T09:31"), np.datetime64(f"{day}T{last}") + 1, np.timedelta64(1, "m"))
    return [str(x).replace("T", " ") for x in t]


@need
def test_xnys_early_close_and_holiday(tmp_path):
    stamps = _minutes("2019-11-27", "16:00") + _minutes("2019-11-29", "13:00")
    f = write(tmp_path / "SPY.csv", "datetime,close\n" + "".join(f"{s},{i}\n" for i, s in enumerate(stamps)))
    ingest([f], tmp_path / "x", sessions="XNYS")
    st = open_store(tmp_path / "x")
    days, counts = np.unique(st.dates.astype("datetime64[D]").astype(str), return_counts=True)
    assert dict(zip(days, counts)) == {"2019-11-27": 390, "2019-11-29": 210}   # Thanksgiving: none; early close
    late = write(tmp_path / "late.csv", "datetime,close\n" + "".join(f"{s},1\n" for s in stamps)
                 + "2019-11-29 13:30,1\n")
    with pytest.raises(InputError, match=r"not in the calendar \(2019-11-29 13:30\)"):
        ingest([late], tmp_path / "y", sessions="XNYS")


def test_without_the_library_an_exchange_code_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "exchange_calendars", None)   # import fails as if not installed
    f = write(tmp_path / "a.csv", "date,close\n2020-01-02,1\n2020-01-03,2\n")
    with pytest.raises(InputError, match=r"exchange calendar XNYS: needs the optional package exchange_calendars: "
                                         r"pip install"):
        ingest([f], tmp_path / "s", calendar="XNYS")


@need
def test_appends_follow_the_exchange_days(real, tmp_path):
    from kline_store import append
    f = real / "intraday_ashare_1min" / "000001.XSHG_1MIN.csv"
    lines = f.read_text().splitlines()
    head, tail = tmp_path / "a.csv", tmp_path / "b.csv"
    write(head, "\n".join(lines[:1 + 5 * 240]) + "\n")
    write(tail, "\n".join(lines[:1] + lines[1 + 5 * 240:]) + "\n")
    ingest([head], tmp_path / "s", sessions="XSHG")
    append(tmp_path / "s", [tail])
    ingest([f], tmp_path / "full", sessions="XSHG")
    a, b = open_store(tmp_path / "s"), open_store(tmp_path / "full")
    assert np.array_equal(a.dates, b.dates)
    np.testing.assert_array_equal(a.panel[:, :, :4], b.panel[:, :, :4])
    first = write(tmp_path / "d1.csv", "datetime,close\n" + "".join(f"{s},1\n" for s in _minutes("2019-11-27", "16:00")))
    second = write(tmp_path / "d2.csv", "datetime,close\n" + "".join(f"{s},2\n" for s in _minutes("2019-11-29", "13:00")))
    ingest([first], tmp_path / "n", sessions="XNYS", symbol="SPY")
    append(tmp_path / "n", [second], symbol="SPY")
    days, counts = np.unique(open_store(tmp_path / "n").dates.astype("datetime64[D]").astype(str), return_counts=True)
    assert dict(zip(days, counts)) == {"2019-11-27": 390, "2019-11-29": 210}   # the early close, not 390 bars
