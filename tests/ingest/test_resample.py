"""resample.py: periods aligned to each session's open, and NaN-aware aggregation against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError
from kline_store.store import sessions
from kline_store.ingest.resample import aggregate, periods

DAY = 18444 * 1440


def _day(clock):
    return DAY + np.asarray(clock, dtype=np.int64)


def test_hours_of_an_ashare_day_even_with_a_missing_first_minute():
    cal = _day(sessions.load("ashare").day_stamps("1min"))
    for keys in (np.r_[cal, cal + 1440], np.r_[cal, cal[1:] + 1440]):   # 09:31 missing on the second day
        p = periods(keys, "1min", "60min")
        assert [int(k % 1440) for k in p.keys[-4:]] == [630, 690, 840, 900]   # 10:30 11:30 14:00 15:00
    p = periods(cal, "1min", "60min", sessions.load("ashare"))
    assert p.starts.tolist() == [0, 60, 120, 180]
    assert periods(np.r_[cal, cal + 1440], "1min", "1d").keys.tolist() == [18444, 18445]
    start = _day(sessions.load("24h").day_stamps("60min"))
    assert periods(start, "60min", "240min", sessions.load("24h")).keys[:2].tolist() == [DAY, DAY + 240]


def test_a_halt_keeps_the_periods_on_the_days_grid():
    """A 45-minute halt (no bar of any symbol) on one day of five: the bars after it stay in their hours."""
    cal = _day(sessions.load("ashare").day_stamps("1min"))
    days = [cal + d * 1440 for d in range(5)]
    clock = days[2] % 1440
    days[2] = days[2][(clock <= 600) | (clock > 645)]                      # nothing from 10:01 to 10:45
    p = periods(np.concatenate(days), "1min", "60min")
    assert {int(k % 1440) for k in p.keys} == {630, 690, 840, 900} and len(p.keys) == 20


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.sampled_from([0.0, 0.3, 1.0]))
def test_aggregate_matches_a_plain_reference(seed, k, holes):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    block = rng.normal(10, 1, (2, n, 3)).astype(np.float32)
    block[rng.random((2, n, 3)) < holes] = np.nan
    starts = np.unique(np.r_[0, rng.integers(0, n, k)])
    out = aggregate(block, starts, ["open", "high", "volume"])
    ends = np.r_[starts[1:], n]
    for s in range(2):
        for j, (a, b) in enumerate(zip(starts, ends)):
            for f, fn in enumerate((lambda v: v[np.isfinite(v)][0], np.nanmax, np.nansum)):
                v = block[s, a:b, f]
                want = fn(v) if np.isfinite(v).any() else np.nan
                np.testing.assert_allclose(out[s, j, f], want, rtol=1e-6, equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["ashare", "us", None]), st.sampled_from([2, 3, 5, 10, 15, 20, 30, 45, 60, 90, 120, 150, 240,
                                                                  390, 1440]),
       st.integers(0, 3))
def test_every_period_is_stamped_inside_its_session(template, k, missing):
    """Issue 19: 90, 240 or 1440 minutes stamped bars after the session close or on the next day."""
    name = template or "ashare"
    sess = sessions.load(name)
    cal = _day(sess.day_stamps("1min"))
    keys = np.concatenate([cal[missing:] + d * 1440 for d in range(3)])     # first minutes missing, 3 days
    longest = max(b - a for a, b in sess.intervals)
    if k > longest:
        with pytest.raises(InputError, match=f"--freq {k}min is longer than the longest session"):
            periods(keys, "1min", f"{k}min", sess if template else None)
        return
    p = periods(keys, "1min", f"{k}min", sess if template else None)
    clock, day = p.keys % 1440, p.keys // 1440
    assert set(day.tolist()) == {DAY // 1440 + d for d in range(3)}       # never on the next day
    inside = np.zeros(len(clock), dtype=bool)
    for a, b in sess.intervals:
        inside |= (clock > a) & (clock <= b)
    assert inside.all(), sorted(set(clock[~inside].tolist()))             # never after a close
    assert np.all(np.diff(p.keys) > 0)
    # every source bar lands in the period stamped at or after it, within its session
    owner = np.repeat(p.keys, np.diff(np.r_[p.starts, len(keys)]))
    assert np.all(owner >= keys) and np.all(owner - keys < k)


def test_ninety_minutes_of_ashare_end_at_the_session_closes():
    cal = _day(sessions.load("ashare").day_stamps("1min"))
    p = periods(cal, "1min", "90min", sessions.load("ashare"))
    assert [f"{int(k % 1440) // 60:02d}:{int(k % 1440) % 60:02d}" for k in p.keys] == ["11:00", "11:30", "14:30",
                                                                                        "15:00"]
