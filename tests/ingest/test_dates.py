"""Date cells -> local timestamps: every accepted form, times of day kept, one message per kind of bad date,
and the 1800..2200 range."""

from pathlib import Path

import polars as pl
import pytest

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
