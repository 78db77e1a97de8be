"""timeaxis.py: bar sizes, keys and stamps, and the bar size of intraday bars found from their gaps."""

from __future__ import annotations

import numpy as np
import pytest

from kline_store.store import timeaxis
from kline_store.errors import InputError


@pytest.mark.parametrize("text,want", [("1d", "1d"), ("1 day", "1d"), ("1min", "1min"), ("5m", "5min"),
                                       ("60min", "60min"), ("1h", "60min"), ("2H", "120min"), ("30 minutes", "30min")])
def test_parse_freq(text, want):
    assert timeaxis.parse_freq(text) == want


@pytest.mark.parametrize("text,msg", [("7min", "divide a day"), ("2d", "longer than a day"), ("fast", "bar size"),
                                      ("0min", "divide a day")])
def test_bad_freq(text, msg):
    with pytest.raises(InputError, match=msg):
        timeaxis.parse_freq(text)


def test_keys_stamps_and_text():
    t = np.array(["2020-07-01T09:31", "2020-07-01T13:01"], dtype="datetime64[m]")
    k = timeaxis.keys(t, "m")
    assert np.array_equal(timeaxis.stamps(k, "m"), t) and timeaxis.iso(t) == ["2020-07-01T09:31", "2020-07-01T13:01"]
    assert timeaxis.keys(t, "D").tolist() == [18444, 18444] and timeaxis.iso(timeaxis.stamps(np.array([18444]), "D")) == ["2020-07-01"]
    assert timeaxis.show(int(k[0]), "m") == "2020-07-01 09:31" and timeaxis.unit("1d") == "D" and timeaxis.minutes("15min") == 15


def test_detect_freq_from_gaps():
    day = 18444 * 1440
    five = day + np.array([575, 580, 585, 590, 780, 785])               # 5-minute bars with a lunch break
    assert timeaxis.detect_freq(np.r_[five, five + 1440], np.zeros(12, int)) == "5min"
    # one bar a day, stamped at varying times (a daily file with a stray 14:59 among its 15:00s): daily
    assert timeaxis.detect_freq(np.array([day + 900, day + 1440 + 899]), np.array([0, 0])) == "1d"
