"""sessions.py: templates and session files, the bars of a trading day, calendars, session numbers."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import write
from kline_store.store import sessions
from kline_store.errors import InputError


def test_templates_give_the_usual_bar_counts():
    a = sessions.load("ashare")
    stamps = a.day_stamps("1min")
    assert len(stamps) == 240 and stamps[0] == 9 * 60 + 31 and stamps[119] == 11 * 60 + 30 and stamps[120] == 13 * 60 + 1
    assert len(sessions.load("us").day_stamps("1min")) == 390 and len(a.day_stamps("5min")) == 48
    fx = sessions.load("24h")
    assert fx.stamp == "start" and fx.day_stamps("60min")[[0, -1]].tolist() == [0, 23 * 60]
    assert sessions.load("us", stamp="start").day_stamps("30min")[0] == 9 * 60 + 30
    assert sessions.Sessions.from_dict(a.as_dict()) == a
    with pytest.raises(InputError, match="whole number"):
        sessions.load("us").day_stamps("60min")


def test_session_files(tmp_path):
    f = write(tmp_path / "tokyo.csv", "open,close\n09:00,11:30\n12:30,15:30\n")
    s = sessions.load(str(f))
    assert len(s.day_stamps("1min")) == 150 + 180
    for text, msg in (("open,close\n10:00,09:00\n", "increasing"), ("a,b\n09:00,10:00\n", "open,close"),
                      ("open,close\n9h,10:00\n", "time of day")):
        with pytest.raises(InputError, match=msg):
            sessions.load(str(write(tmp_path / "bad.csv", text)))
    with pytest.raises(InputError, match="not a template"):
        sessions.load("mars")


def test_calendar_and_session_ids():
    day = 18444 * 1440
    bars = np.array([day + 9 * 60 + 35, day + 14 * 60, day + 1440 + 10 * 60])
    cal = sessions.calendar(bars, sessions.load("ashare"), "1min")
    # every session bar of the first date; the second, still trading, up to its last bar (10:00)
    assert len(cal) == 240 + 30 and cal[0] == day + 571 and cal[-1] == bars[-1] and np.isin(bars, cal).all()
    cal = sessions.calendar(np.r_[bars, day + 1440 + 900], sessions.load("ashare"), "1min")
    assert len(cal) == 480
    ids = sessions.session_ids(cal, "1min")
    assert ids.max() == 3 and (np.diff(ids) >= 0).all() and ids[119] == 0 and ids[120] == 1
