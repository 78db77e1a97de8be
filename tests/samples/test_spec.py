"""spec.py: sample options validated on their own, resolved against a store's fields and calendar."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from kline_store.errors import InputError
from kline_store.samples.spec import SamplePlan, SampleSpec, resolve

FIELDS = ["open", "high", "low", "close", "volume", "amount", "turnover", "adj_factor"]
DATES = np.datetime64("2020-01-01") + np.arange(100)


def test_spec_is_validated_frozen_and_picklable():
    s = SampleSpec.make(32, "close", 2, "2020-02-01", None, label="log_return")
    assert s.fields == ("close",) and s.start == np.datetime64("2020-02-01") and s.end is None
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(AttributeError):
        s.window = 3  # type: ignore[misc]
    for bad, msg in [(dict(window=0), "window=0"), (dict(adjust="sideways"), "adjust="),
                     (dict(days="symbol", missing="ffill"), "days='symbol'"), (dict(max_missing=2), "max_missing"),
                     (dict(fields=[]), "fields=\\[\\]"), (dict(fields=["close", "close"]), "listed twice"),
                     (dict(start="soon"), "start=")]:
        with pytest.raises(InputError, match=msg):
            SampleSpec.make(**bad)


def test_resolve_gives_field_roles_and_bounds():
    p = resolve(SampleSpec.make(10, ["volume", "close", "open"], 3, "2020-01-05", "2020-03-01",
                                normalize="window", adjust="forward"), FIELDS, DATES, "S")
    assert p.x_fields == (4, 3, 0) and p.names == ("volume", "close", "open") and p.x_range is None
    assert (p.close, p.adj, p.label_kind, p.adjust_label) == (3, 7, "return", True)
    assert p.price_cols == (1, 2) and p.volume_cols == (0,) and p.volume_like_cols == (0,)
    assert (p.lo, p.hi, p.n_dates) == (4, 60, 100)
    default = resolve(SampleSpec(), FIELDS, DATES, "S")
    assert default.names == ("open", "high", "low", "close", "volume", "amount") and default.x_range == (0, 6)
    keep, compact = resolve(SampleSpec.make(5, ["volume"], label="turnover"), FIELDS, DATES, "S").compact()
    assert keep == [4, 6] and compact.x_fields == (0,) and compact.label_field == 1 and compact.close is None


def test_resolve_errors_name_the_store():
    for spec, msg in [(SampleSpec.make(fields=["vwap"]), "S: unknown field 'vwap'"),
                      (SampleSpec.make(window=99, horizon=2), "longer than the calendar of S"),
                      (SampleSpec.make(label="alpha"), "label='alpha'"),
                      (SampleSpec.make(label="close", adjust="forward"), "label would be raw")]:
        with pytest.raises(InputError, match=msg):
            resolve(spec, FIELDS, DATES, "S")
    with pytest.raises(InputError, match="no 'adj_factor' field"):
        resolve(SampleSpec.make(adjust="backward"), FIELDS[:-1], DATES, "S")
    with pytest.raises(InputError, match="no 'close' field"):
        resolve(SampleSpec.make(fields=["open"]), ["open"], DATES, "S")
    assert isinstance(resolve(SampleSpec.make(fields=["open"], label="open"), ["open"], DATES, "S"), SamplePlan)


@pytest.mark.parametrize("value", [2.5, True, "64", None])
def test_window_and_horizon_are_whole_numbers(value):
    """window=2.5 once made windows of 2, window=True of 1, and '64' was accepted."""
    for name in ("window", "horizon") if value is not None else ("window",):   # horizon=None: the default
        with pytest.raises(InputError, match=f"{name}=.*: expected a whole number of bars"):
            SampleSpec.make(**{name: value})
    assert SampleSpec.make(window=np.int64(8)).window == 8
    assert resolve(SampleSpec.make(horizon=None), FIELDS, DATES, "S").horizon == 1
