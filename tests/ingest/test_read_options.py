"""Options as objects (issue 27 part 3, issue 24 part 5): every keyword of ingest() and append() reaches the
DataFrame path, and the two options lost before (ingest's timezone, append's calendar) now act on a frame."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pandas as pd
import pytest

from conftest import write
from kline_store import append, ingest, open_store
from kline_store.ingest import ingestion, update
from kline_store.ingest.options import KEYWORD_FIELDS, AxisOptions, ReadOptions

FRAME = pd.DataFrame({"symbol": ["AAA"] * 3, "date": ["2024-01-02", "2024-01-03", "2024-01-04"],
                      "close": [1.0, 2.0, 3.0]})

# A value other than the default for each keyword (what the DataFrame path must receive), by type of default.
SAMPLE = {"calendar": "cal.csv", "user_map": {"px": "close"}, "map": ["px2=open"], "strict": True, "quiet": False,
          "capacity": 77, "wait": 1.5, "replace": True, "symbol_pattern": r"(\w+)", "freq": "1d",
          "sessions": "us", "stamp": "start", "instruments": "csi300", "symbol": "AAA", "na": ["."],
          "skip_bad": True, "exclude": ["*nothing*"], "timezone": "Asia/Shanghai", "dry_run": True,
          "assume_weekdays": True, "date_format": "%d-%b-%y", "skip_rows": 2, "no_header": True,
          "columns": ["date", "close"], "round_stamps": True}


class Reached(Exception):
    pass


def _keywords(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]


def _spy(monkeypatch, module, name):
    """Record the calls of module.name; the second one (the DataFrame path, on its temporary file) stops."""
    real, calls = getattr(module, name), []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        if len(calls) == 2:
            raise Reached
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def _received(args, kwargs) -> dict:
    """Every option the DataFrame path got: fields of the options objects, then plain keywords."""
    got = {}
    for obj in (*args, *kwargs.values()):
        if dataclasses.is_dataclass(obj):
            got.update({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    got.update({k: v for k, v in kwargs.items() if not dataclasses.is_dataclass(v)})
    return got


def _check(keyword, value, got):
    name = KEYWORD_FIELDS.get(keyword, keyword)
    assert name in got, f"{keyword}= does not reach the DataFrame path"
    if keyword == "map":
        assert dict(got[name]).items() >= {"px2": "open"}.items(), f"{keyword}= lost on the DataFrame path"
    elif keyword == "user_map":
        assert dict(got[name]).items() >= value.items(), f"{keyword}= lost on the DataFrame path"
    elif isinstance(value, list):
        assert tuple(got[name]) == tuple(value), f"{keyword}= lost on the DataFrame path"
    else:
        assert got[name] == value, f"{keyword}= lost on the DataFrame path"


@pytest.mark.parametrize("keyword", _keywords(ingest))
def test_every_keyword_of_ingest_reaches_the_dataframe_path(keyword, tmp_path, monkeypatch):
    assert keyword in SAMPLE, f"new keyword {keyword}: give it a sample value here"
    calls = _spy(monkeypatch, ingestion, "ingest_with")
    with pytest.raises(Reached):
        ingest(FRAME, tmp_path / "s", **{keyword: SAMPLE[keyword]})
    (args, kwargs) = calls[1]
    assert str(args[0][0]).endswith("DataFrame.parquet")
    _check(keyword, SAMPLE[keyword], _received(args, kwargs))


@pytest.mark.parametrize("keyword", _keywords(append))
def test_every_keyword_of_append_reaches_the_dataframe_path(keyword, tmp_path, monkeypatch):
    assert keyword in SAMPLE, f"new keyword {keyword}: give it a sample value here"
    calls = _spy(monkeypatch, update, "append_with")
    with pytest.raises(Reached):
        append(tmp_path / "s", FRAME, **{keyword: SAMPLE[keyword]})
    (args, kwargs) = calls[1]
    assert str(args[1][0]).endswith("DataFrame.parquet")
    _check(keyword, SAMPLE[keyword], _received(args, kwargs))


def test_every_option_field_is_a_keyword_of_ingest_and_append():
    fields = {f.name for cls in (ReadOptions, AxisOptions) for f in dataclasses.fields(cls)}
    ingest_kw = {KEYWORD_FIELDS.get(k, k) for k in _keywords(ingest)}
    append_kw = {KEYWORD_FIELDS.get(k, k) for k in _keywords(append)}
    assert fields <= ingest_kw
    assert {f.name for f in dataclasses.fields(ReadOptions)} <= append_kw


def test_a_frame_takes_the_timezone(tmp_path):
    """Stamps at 16:00 UTC are the next day in Shanghai: a frame ingested with timezone= is the file's store."""
    rows = [("2024-01-0%d 16:00:00+00:00" % d, float(d)) for d in (2, 3, 4)]
    f = write(tmp_path / "AAA.csv", "date,close\n" + "".join(f"{t},{c}\n" for t, c in rows))
    frame = pd.DataFrame({"date": pd.to_datetime([t for t, _ in rows]), "close": [c for _, c in rows]})
    ingest([f], tmp_path / "file", timezone="Asia/Shanghai")
    ingest(frame, tmp_path / "frame", symbol="AAA", timezone="Asia/Shanghai")
    a, b = open_store(tmp_path / "file"), open_store(tmp_path / "frame")
    assert [str(d) for d in b.dates] == ["2024-01-03", "2024-01-04", "2024-01-05"]
    assert np.array_equal(a.dates, b.dates) and b.manifest["timezone"] == "Asia/Shanghai"
    np.testing.assert_array_equal(a.panel, b.panel)


def test_a_frame_appended_takes_the_calendar(tmp_path):
    """A store built with a calendar file takes new dates from the calendar given to append, frames too."""
    cal = write(tmp_path / "cal.csv", "date\n2024-01-02\n2024-01-03\n")
    more = write(tmp_path / "more.csv", "date\n2024-01-04\n2024-01-05\n")
    ingest(FRAME.iloc[:2], tmp_path / "s", calendar=str(cal))
    rep = append(tmp_path / "s", FRAME.iloc[2:].reset_index(drop=True), calendar=str(more))
    st = open_store(tmp_path / "s")
    assert [str(d) for d in st.dates] == ["2024-01-02", "2024-01-03", "2024-01-04", "2024-01-05"]
    np.testing.assert_array_equal(st.array("close")[0], [1.0, 2.0, 3.0, np.nan])
    assert rep.extra["new dates"] == 2 and st.manifest["calendar_source"] == str(more)
