"""ranges.py: date arguments, calendar bounds of a range, and embargoed splits."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.samples.ranges import date_bounds, day_name, split_bounds, to_time
from kline_store.errors import InputError


DATES = np.array(["2020-01-02", "2020-01-03", "2020-01-06", "2020-01-07", "2020-01-08", "2020-01-09",
                  "2020-01-10", "2020-01-13"], dtype="datetime64[D]")


def test_date_bounds_take_trading_days_inside_the_range():
    assert date_bounds(DATES) == (0, 7)
    assert date_bounds(DATES, "2020-01-04", "2020-01-11") == (2, 6)  # weekend dates snap inwards
    assert date_bounds(DATES, np.datetime64("2020-01-06"), "2020-01-06") == (2, 2)
    assert date_bounds(DATES, dt.date(2020, 1, 3), dt.datetime(2020, 1, 9, 15)) == (1, 5)
    lo, hi = date_bounds(DATES, "2021-01-01", None)
    assert lo > hi
    with pytest.raises(InputError, match="start="):
        date_bounds(DATES, "yesterday")


def test_split_bounds_purge_the_earlier_split():
    # contiguous calendar ranges: train loses its last `embargo` label days
    b = split_bounds(DATES, [("2020-01-01", "2020-01-07"), ("2020-01-08", None)], embargo=2)
    assert b == [(0, 1), (4, 7)]
    # open end: reaches exactly to the embargo; open start: begins after it
    assert split_bounds(DATES, [(None, None), ("2020-01-09", None)], 1) == [(0, 3), (5, 7)]
    assert split_bounds(DATES, [(None, "2020-01-06"), (None, "2020-01-13")], 1) == [(0, 2), (4, 7)]
    assert split_bounds(DATES, [(None, "2020-01-03"), None, (None, None)], 3) == [(0, 1), None, (5, 7)]
    with pytest.raises(InputError, match="overlaps"):
        split_bounds(DATES, [(None, "2020-01-08"), ("2020-01-07", None)], 1)
    with pytest.raises(InputError, match="no end"):
        split_bounds(DATES, [(None, None), (None, None)], 1)
    with pytest.raises(InputError, match="holds no day"):
        split_bounds(DATES, [("2020-01-08", None), ("2020-01-09", None)], 2)


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, 7), min_size=2, max_size=2, unique=True), embargo=st.integers(0, 3))
def test_split_bounds_keep_the_embargo(cuts, embargo):
    a, b = sorted(cuts)
    ranges = [(None, DATES[a]), (DATES[b], None)]
    try:
        (_, hi1), (lo2, _) = split_bounds(DATES, ranges, embargo)
    except InputError:
        assert a + 1 > b - embargo - 1  # nothing left of the first split (or overlap)
        return
    assert lo2 - hi1 - 1 >= embargo and hi1 <= a and lo2 == b


def test_to_time_and_day_name():
    assert to_time(None, "x") is None
    assert to_time(dt.datetime(2020, 1, 2, 15), "x") == np.datetime64("2020-01-02T15:00")
    assert to_time("2020-01-02", "x").dtype == np.dtype("datetime64[D]")
    assert to_time("2020-01-02 09:31", "x") == np.datetime64("2020-01-02T09:31")
    with pytest.raises(InputError, match="end='NaT'"):
        to_time("NaT", "end")
    assert day_name(DATES, 0) == "2020-01-02" and day_name(DATES, -1) == "before the calendar"
    assert day_name(DATES, 99) == "after the calendar"


def test_bounds_on_an_intraday_calendar():
    bars = np.array(["2020-07-01T09:31", "2020-07-01T15:00", "2020-07-02T09:31", "2020-07-02T15:00",
                     "2020-07-03T09:31"], dtype="datetime64[m]")
    assert date_bounds(bars, "2020-07-02", "2020-07-02") == (2, 3)          # a date holds all its bars
    assert date_bounds(bars, "2020-07-01 10:00", "2020-07-02 09:31") == (1, 2)
    assert date_bounds(bars, None, "2020-07-01 14:59") == (0, 0)
