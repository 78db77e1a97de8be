"""A new panel laid out a chunk of bars at a time (layout.py) equals a dense reference built cell by cell."""

from pathlib import Path

import numpy as np
import pytest

from kline_store.errors import InputError
from kline_store.ingest import panel_layout
from kline_store.ingest.bars import Bars


def bars_of(codes, days, values, fields, names):
    n = len(codes)
    return Bars(names=names, sym=np.asarray(codes, np.uint32), minute=np.asarray(days, dtype=np.int64) * 1440 + 900,
                file=np.zeros(n, np.uint32), row=np.arange(n, dtype=np.uint32),
                values=np.asarray(values, np.float32), fields=fields, files=[Path("x.csv")], sources=[], problems=[])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("step", [3, 1 << 20])
@pytest.mark.parametrize("grouped", [True, False])
def test_blocks_equal_a_dense_reference(seed, step, grouped, monkeypatch):
    monkeypatch.setattr(panel_layout, "STEP", step)
    rng = np.random.default_rng(seed)
    n_sym, n_dates = 6, 13
    calendar = 19000 + np.sort(rng.choice(40, n_dates, replace=False))
    cells = rng.permutation(n_sym * n_dates)[: rng.integers(1, 60)]
    names = [f"S{i}" for i in rng.permutation(n_sym)]             # codes in first-seen order, rows sorted
    rows_of = np.argsort(np.argsort(names)).astype(np.int32)
    code_of_row = np.argsort(rows_of)
    r, p = cells // n_dates, cells % n_dates
    if grouped:
        o = np.lexsort((rng.random(len(r)), r))                    # rows in order, days in any order
        r, p = r[o], p[o]
    values = rng.random((len(r), 2)).astype(np.float32)
    b = bars_of(code_of_row[r], calendar[p], values, ["close", "volume"], names)
    lay = panel_layout.PanelLayout.of(b, calendar, "D", rows_of)
    assert (lay.order is None) == bool(grouped or (np.diff(r) >= 0).all())
    want = np.full((n_sym, n_dates, 3), np.nan, np.float32)
    want[r, p, 1:] = values
    assert (lay.present == ~np.isnan(want[:, :, 1])).all()
    got = np.full_like(want, np.nan)
    for lo in range(0, n_sym, 4):
        lay.fill(got[lo: lo + 4], lo, b, ["open", "close", "volume"])
    np.testing.assert_array_equal(got, want)


def test_a_duplicate_and_a_date_outside_the_calendar_are_named(monkeypatch):
    monkeypatch.setattr(panel_layout, "STEP", 2)
    names = ["A", "B"]
    dup = bars_of([0, 0, 1, 0], [19000, 19001, 19000, 19000], np.ones((4, 1)), ["close"], names)
    with pytest.raises(InputError, match="duplicate bar: symbol A at 2022-01-08 15:00 appears 2 times"):
        panel_layout.PanelLayout.of(dup, np.array([19000, 19001]), "D", np.array([0, 1], np.int32))
    off = bars_of([0, 1, 1], [19000, 19000, 19005], np.ones((3, 1)), ["close"], names)
    with pytest.raises(InputError, match=r"1 bar\(s\) at 1 date\(s\) not in the calendar \(2022-01-13\)"):
        panel_layout.PanelLayout.of(off, np.array([19000, 19001]), "D", np.array([0, 1], np.int32))
