"""windows.py: the valid-window index against a brute-force reference (random panels with holes, real data)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_dataset_ref import FIELDS, random_panel, ref_valid
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.samples import ranges
from kline_store.samples import windows
from kline_store.samples.spec import DEFAULT_FIELDS, SamplePlan


def _flat(pairs: list[tuple[int, int]], n_dates: int) -> np.ndarray:
    return np.array([s * n_dates + t for s, t in pairs], dtype=np.int64)


# --------------------------------------------------------------------------- property-based, small panels


@st.composite
def cases(draw):
    n_sym = draw(st.integers(1, 4))
    n_dates = draw(st.integers(2, 30))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    fields = ["open", "close", "volume", "adj_factor"]
    panel = random_panel(rng, n_sym, n_dates, fields, holes=draw(st.sampled_from([0.0, 0.1, 0.4])))
    if draw(st.booleans()):  # zero and negative closes: no return label there
        panel[:, :, 1][rng.random((n_sym, n_dates)) < 0.1] = draw(st.sampled_from([0.0, -1.0]))
    if draw(st.booleans()):  # broken adjustment factors
        panel[:, :, 3][rng.random((n_sym, n_dates)) < 0.1] = draw(st.sampled_from([np.nan, 0.0]))
    days = draw(st.sampled_from(["calendar", "symbol"]))
    missing = "drop" if days == "symbol" else draw(st.sampled_from(["drop", "ffill"]))
    label = draw(st.sampled_from(["return", "log_return", "field"]))
    x_fields = draw(st.sampled_from([(0, 1, 2), (1,), (2, 0)]))
    adj = 3 if draw(st.booleans()) else None
    rule = SamplePlan(
        window=draw(st.integers(1, 6)), horizon=draw(st.integers(1, 4)), x_fields=x_fields,
        close=None if label == "field" and draw(st.booleans()) else 1, label_kind=label,
        label_field=2 if label == "field" else None, adj=adj, adjust="forward" if adj is not None else "none",
        missing=missing, max_missing=draw(st.sampled_from([None, 0, 2])) if missing == "ffill" else None,
        days=days)
    lo = draw(st.integers(0, n_dates))
    hi = draw(st.integers(-1, n_dates - 1))
    return panel, rule, lo, hi


@settings(max_examples=300, deadline=None)
@given(cases())
def test_valid_index_matches_brute_force(case):
    panel, rule, lo, hi = case
    got, bars = windows.valid_index(panel, rule, lo, hi)
    want = ref_valid(panel, list(rule.x_fields), rule.close, rule.window, rule.horizon, lo, hi, rule.label_kind,
                     rule.label_field, rule.missing, rule.max_missing, rule.days, rule.adj)
    np.testing.assert_array_equal(got, _flat(want, panel.shape[1]))
    assert got.dtype == np.int32   # flat cells of a small panel fit in 4 bytes
    if rule.days == "symbol":
        assert bars is not None and np.all(np.diff(bars) > 0)
        # a window's last day is a bar and its label is `horizon` bars later, same symbol
        lab = windows.symbol_label_day(got, bars, rule.horizon)
        assert np.all(lab // panel.shape[1] == got // panel.shape[1]) and np.all(lab % panel.shape[1] <= hi)


@settings(max_examples=100, deadline=None)
@given(n_sym=st.integers(1, 5), n_dates=st.integers(1, 12), seed=st.integers(0, 1000))
def test_by_day_groups_every_window_once(n_sym, n_dates, seed):
    rng = np.random.default_rng(seed)
    valid = np.flatnonzero(rng.random(n_sym * n_dates) < 0.5).astype(np.int64)
    days, offsets, order = windows.by_day(valid, n_sym, n_dates)
    assert sorted(order.tolist()) == valid.tolist()
    for k, d in enumerate(days):
        part = order[offsets[k]: offsets[k + 1]]
        assert len(part) > 0 and np.all(part % n_dates == d) and np.all(np.diff(part) > 0)
    assert set(days.tolist()) == set((valid % n_dates).tolist())


def test_window_count_and_all():
    ok = np.array([[1, 1, 0, 1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(windows.window_all(ok, 2), [[False, True, False, False, True, True]])
    np.testing.assert_array_equal(windows.window_count(~ok, 3), [[4, 4, 1, 1, 1, 0]])
    assert not windows.window_all(ok, 7).any()  # window longer than the row


# --------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def ashare(real, tmp_path_factory):
    from kline_store import ingest, open_store

    path = tmp_path_factory.mktemp("windows") / "ashare"
    ingest([real / "ashare_qfq_daily" / "data_20251009"], path)
    return open_store(path)


@pytest.mark.parametrize("days,missing", [("calendar", "drop"), ("calendar", "ffill"), ("symbol", "drop")])
def test_real_index_matches_brute_force(ashare, days, missing):
    st_ = ashare
    panel = st_.panel[:60]  # a third of the symbols keeps the Python reference quick
    close = st_.fields.index("close")
    x_fields = list(range(len(st_.fields)))
    lo, hi = ranges.date_bounds(st_.dates, "2021-03-01", "2024-06-30")
    rule = SamplePlan(window=20, horizon=5, x_fields=tuple(x_fields), close=close, missing=missing,
                        max_missing=3 if missing == "ffill" else None, days=days)
    got, _ = windows.valid_index(panel, rule, lo, hi)
    want = ref_valid(panel, x_fields, close, 20, 5, lo, hi, missing=missing,
                     max_missing=3 if missing == "ffill" else None, days=days)
    np.testing.assert_array_equal(got, _flat(want, st_.n_dates))
    assert len(got) > 10_000


def test_real_suspension_is_never_inside_a_calendar_window(ashare):
    st_ = ashare
    s = st_.symbols.index("000670")
    rule = SamplePlan(window=10, horizon=1, x_fields=tuple(range(len(st_.fields))), close=3)
    valid, _ = windows.valid_index(st_.panel[s: s + 1], rule, 0, st_.n_dates - 1)
    t = valid % st_.n_dates
    gap_from, gap_to = np.searchsorted(st_.dates, np.datetime64("2020-03-19")), \
        np.searchsorted(st_.dates, np.datetime64("2022-08-22"))
    # the suspension days have no bar, so no window touches them; windows resume 10 bars after trading resumes
    assert not np.any((t - 9 <= gap_to - 1) & (t >= gap_from + 1))
    assert t[t > gap_from].min() == gap_to + 9
    # over its own trading days the same symbol has windows that span the suspension
    sym_rule = SamplePlan(window=10, horizon=1, x_fields=rule.x_fields, close=3, days="symbol")
    valid_s, _ = windows.valid_index(st_.panel[s: s + 1], sym_rule, 0, st_.n_dates - 1)
    assert len(valid_s) > len(valid) and np.any((valid_s % st_.n_dates > gap_to) & (valid_s % st_.n_dates < gap_to + 9))


def test_default_fields_exist_in_canonical_names():
    assert set(DEFAULT_FIELDS) == set(FIELDS)
