"""Date cells -> local timestamps: every accepted form, times of day kept, one message per kind of bad date,
and the 1800..2200 range."""

import datetime as dt
from pathlib import Path

import pandas as pd
import polars as pl
import pytest
from hypothesis import given, settings, strategies as st

from kline_store.ingest import columns, dates
from kline_store.ingest.dates import parse_dates, parse_days
from kline_store.errors import InputError


def parse(values, dtype=None, fn=parse_days):
    s = pl.Series("d", values, dtype=dtype)
    return fn(s, Path("f.csv"), "d", lambda i: f"line {int(i) + 2}")


@pytest.mark.parametrize("cell,stamp", [("2020-07-01 09:31:00", "2020-07-01 09:31:00"),
                                        ("2020-07-01 09:31", "2020-07-01 09:31:00"),
                                        ("2020/07/01 13:01", "2020-07-01 13:01:00"),
                                        ("2020-07-01T15:00:00Z", "2020-07-01 15:00:00"),
                                        ("20200701", "2020-07-01 00:00:00")])
def test_times_of_day_are_kept(cell, stamp):
    assert str(parse([cell], fn=parse_dates)[0]) == stamp


def test_numeric_stamps():
    assert str(parse([202007010931], fn=parse_dates)[0]) == "2020-07-01 09:31:00"
    assert str(parse([19991110.0, 19991111.0], pl.Float64, fn=parse_dates)[1]) == "1999-11-11 00:00:00"
    with pytest.raises(InputError, match="line 2: unparseable date 19991110.5"):
        parse([19991110.5], pl.Float64)
    with pytest.raises(InputError, match="a time of day"):
        parse(["2020-07-01 25:61"], fn=parse_dates)
    # the same as text in a CSV (the error message listed the form as accepted, and the text was refused)
    assert str(parse(["202007010931", "202007011500"], fn=parse_dates)[1]) == "2020-07-01 15:00:00"
    assert str(parse([" 20200701093130 "], fn=parse_dates)[0]) == "2020-07-01 09:31:30"
    with pytest.raises(InputError, match="line 3: unparseable date '202007010961' .*expected YYYYMMDDHHMM"):
        parse(["202007010931", "202007010961"], fn=parse_dates)


@pytest.mark.parametrize("cell", ["20240102", "2024-01-02", "2024-01-02 15:00:00", "1/2/2024", "2024/01/02",
                                  "2024-01-02T00:00:00Z", "2024.01.02", " 2024-01-02 "])
def test_accepted_forms(cell):
    assert str(parse([cell, cell])[0]) == "2024-01-02"


def test_integers_and_typed_values():
    assert [str(d) for d in parse([20240102, 20231229])] == ["2024-01-02", "2023-12-29"]
    assert str(parse([20240102.0], pl.Float64)[0]) == "2024-01-02"
    assert str(parse(["2024-01-02"]).cast(pl.Date)[0]) == "2024-01-02"


@pytest.mark.parametrize("values,message", [
    (["0001-01-01"], r"line 2: date 0001-01-01 \('0001-01-01'\) in column 'd' is outside 1800-01-01..2200-12-31"),
    (["2024-01-02", "9999-12-31"], r"line 3: date 9999-12-31"),
    ([17991231], r"line 2: date 1799-12-31 \(17991231\) in column 'd' is outside 1800-01-01..2200-12-31"),
    ([20240230], r"line 2: unparseable date 20240230"),
    (["2024-02-30"], r"line 2: unparseable date '2024-02-30'"),
    (["2024-01-02", None], r"line 3: missing date in column 'd'"),
    (["2024-01-02", "2024/01/03"], r"mixed date formats in column 'd': '2024-01-02' \(line 2\) and '2024/01/03' \(line 3\)"),
    (["x" * 500], r"line 2: unparseable date 'xxxx.*\.\.\.' in column 'd'"),
])
def test_bad_dates_are_named(values, message):
    """Case 8: 0001-01-01 and 9999-12-31 passed as "problems: none"."""
    with pytest.raises(InputError, match=rf"f\.csv: {message}") as e:
        parse(values)
    assert len(str(e.value)) < 200


def test_typed_dates_out_of_range():
    import datetime
    with pytest.raises(InputError, match="outside 1800-01-01..2200-12-31"):
        parse([datetime.date(1, 1, 1)], pl.Date)


def test_typed_stamps_are_converted_and_checked():
    """Timestamps (a Parquet minute file's column on the path where polars' own conversion was refused): the
    same stamps in milliseconds, the first missing or out-of-range one named by its line."""
    import datetime
    t = datetime.datetime(2024, 1, 2, 9, 31)
    out = parse([t, t + datetime.timedelta(minutes=1), t], pl.Datetime("us"), fn=parse_dates)
    assert out.dtype == pl.Datetime("ms") and [str(v) for v in out] == ["2024-01-02 09:31:00", "2024-01-02 09:32:00",
                                                                       "2024-01-02 09:31:00"]
    with pytest.raises(InputError, match=r"f\.csv: line 3: missing date in column 'd'"):
        parse([t, None, t], pl.Datetime("ms"), fn=parse_dates)
    with pytest.raises(InputError, match=r"line 4: date 2201-01-01 \(datetime.datetime\(2201, 1, 1, 0, 0\)\) in "
                                         r"column 'd' is outside 1800-01-01..2200-12-31"):
        parse([t, t, datetime.datetime(2201, 1, 1)], pl.Datetime("ms"), fn=parse_dates)


def test_integral_float_stamps_with_a_time_of_day():
    """pandas writes a YYYYMMDDHHMM column that once held a NaN as 202007010931.0."""
    from kline_store.ingest.dates import integral_float_dates
    out = integral_float_dates(pl.Series("d", ["202007010931.0", "202007010932.0", None]), Path("f.csv"), "d",
                               lambda i: f"line {int(i) + 2}")
    assert out.to_list() == [202007010931, 202007010932, None]
    with pytest.raises(InputError, match="line 2: unparseable date '202007010931.5'"):
        integral_float_dates(pl.Series("d", ["202007010931.5"]), Path("f.csv"), "d", lambda i: f"line {int(i) + 2}")


def test_float_dates_with_a_null_word_name_the_missing_one():
    """'nan' among float dates once made the error blame line 2's good '20240102.0'."""
    from kline_store.ingest.dates import integral_float_dates
    out = integral_float_dates(pl.Series("d", ["20240102.0", "nan", " NA "]), Path("f.csv"), "d",
                               lambda i: f"line {int(i) + 2}")
    assert out.to_list() == [20240102, None, None]


# --- stamps parsed or refused, never half-read (issue 19) ----------------------------------------------------

@pytest.mark.parametrize("cell,stamp", [("7/1/2020 1:31 PM", "2020-07-01 13:31:00"),
                                        ("7/1/2020 9:31 AM", "2020-07-01 09:31:00"),
                                        ("7/1/2020 12:01 AM", "2020-07-01 00:01:00"),
                                        ("7/1/2020 12:01 pm", "2020-07-01 12:01:00"),
                                        ("2020-07-01 01:31:00PM", "2020-07-01 13:31:00")])
def test_twelve_hour_clocks_with_am_pm(cell, stamp):
    assert str(parse([cell], fn=parse_dates)[0]) == stamp


@pytest.mark.parametrize("cell", ["7/1/2020 13:31 PM", "7/1/2020 0:31 AM", "2020-07-01 09:31 foo",
                                  "2020-07-01 09:31+8", "2020-07-01 9"])
def test_a_stamp_not_read_whole_is_refused(cell):
    with pytest.raises(InputError, match="line 2: unparseable date"):
        parse([cell], fn=parse_dates)


def test_mixed_utc_offsets_are_refused_or_converted_to_the_exchange_clock():
    cells = ["2020-07-01T09:31:00+08:00", "2020-07-01T01:32:00Z", "2020-07-01T09:33:00+08:00"]
    with pytest.raises(InputError, match=r"different UTC offsets in column 'd': '2020-07-01T09:31:00\+08:00' \(line 2\)"
                                         r" and '2020-07-01T01:32:00Z' \(line 3\); pass --timezone"):
        parse(cells, fn=parse_dates)
    with dates.exchange_zone("Asia/Shanghai"):
        got = [str(x) for x in parse(cells, fn=parse_dates)]
    assert got == ["2020-07-01 09:31:00", "2020-07-01 09:32:00", "2020-07-01 09:33:00"]
    aware = pl.Series("d", [0, 60_000], dtype=pl.Datetime("ms", "UTC"))   # a zone-aware Parquet column
    with dates.exchange_zone("Asia/Shanghai"):
        assert str(parse(aware, fn=parse_dates)[1]) == "1970-01-01 08:01:00"
    with pytest.raises(InputError, match="--timezone 'Mars/Base'"):
        with dates.exchange_zone("Mars/Base"):
            pass


CLOCKS = ["", " %H:%M", " %H:%M:%S", "T%H:%M:%S", " %I:%M %p", " %I:%M:%S%p"]
ZONES = ["", "Z", "+08:00", "-0530", "+0000"]


@st.composite
def stamps(draw):
    """Strings in every date pattern of dates.py, with and without a clock (24- or 12-hour), offset or Z."""
    # up to 2099: converted to an exchange's zone, offset stamps after 2099 lose daylight saving (docs/limits.md)
    moments = draw(st.lists(st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2099, 12, 31)),
                            min_size=1, max_size=5))
    fmt = draw(st.sampled_from(columns.DATE_FORMATS))
    clock = draw(st.sampled_from(CLOCKS))
    if fmt == "%Y%m%d":   # digits only: YYYYMMDDHHMM is its own form
        clock = ""
    zone = draw(st.sampled_from(ZONES)) if clock else ""
    if "%p" in clock and zone:   # "12:00 AMZ" is no stamp to pandas either
        zone = " " + zone
    return [m.replace(microsecond=0).strftime(fmt + clock) + zone for m in moments], zone


@settings(max_examples=150, deadline=None)
@given(stamps(), st.sampled_from([None, "Asia/Shanghai", "America/New_York"]))
def test_every_pattern_agrees_with_pandas(case, tz):
    cells, zone = case
    with dates.exchange_zone(tz):
        ours = [str(x) for x in parse(cells, fn=parse_dates)]
    theirs = []
    for c in cells:
        t = pd.Timestamp(pd.to_datetime(c))
        if t.tzinfo is not None:
            t = (t.tz_convert(tz) if tz else t).tz_localize(None)
        theirs.append(str(t.floor("s").to_pydatetime()))
    assert ours == theirs, cells
