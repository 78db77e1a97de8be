"""Bars -> panel blocks: against a dense reference built cell by cell."""

from pathlib import Path

import numpy as np
import pytest

from kline_store.ingest import panel
from kline_store.ingest.bars import Bars


def bars_of(rows, days, values, fields):
    n = len(rows)
    return Bars(names=[f"S{i}" for i in range(max(rows) + 1)], sym=np.asarray(rows), minute=np.asarray(days, dtype=np.int64) * 1440,
                file=np.zeros(n, np.uint32), row=np.arange(n, dtype=np.uint32),
                values=np.asarray(values, np.float32), fields=fields, files=[Path("x.csv")], sources=[],
                problems=[])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("budget", [1, 10 ** 9])
def test_blocks_equal_a_dense_reference(seed, budget, monkeypatch):
    rng = np.random.default_rng(seed)
    n_rows, n_dates = 7, 11
    cells = rng.permutation(n_rows * n_dates)[: rng.integers(1, 40)]      # any order: date-major, shuffled
    rows, pos = cells // n_dates, cells % n_dates
    values = rng.random((len(cells), 2)).astype(np.float32)
    values[rng.random(values.shape) < 0.2] = np.nan
    b = bars_of(rows, pos, values, ["close", "volume"])
    fields = ["open", "close", "volume"]
    want = np.full((n_rows, n_dates, 3), np.nan, np.float32)
    for i, (r, p) in enumerate(zip(rows, pos)):
        want[r, p, 1:] = values[i]
    monkeypatch.setattr(panel, "BLOCK_BYTES", budget)
    place = panel.BarPlacement.of(rows, pos, n_rows)
    got = np.concatenate([blk for _, blk in panel.new_blocks(b, place, n_rows, n_dates, fields)])
    assert np.array_equal(got, want, equal_nan=True)


def test_scatter_from_a_later_day_and_keeping_stored_values():
    b = bars_of([0, 1, 1], [5, 5, 6], [[1.0, np.nan], [2.0, 20.0], [3.0, 30.0]], ["close", "volume"])
    block = np.zeros((2, 2, 2), np.float32)               # rows 0-1, calendar days 5-6, as stored
    panel.scatter(block, 0, b, panel.BarPlacement.of(b.sym, b.keys("D"), 2), ["close", "volume"], day0=5, keep_stored=True)
    assert block.tolist() == [[[1.0, 0.0], [0.0, 0.0]], [[2.0, 20.0], [3.0, 30.0]]]


def test_block_rows_stay_in_budget():
    assert panel.block_rows(5000, 8, budget=64 << 20) == 419
    assert panel.block_rows(10 ** 9, 8) == 1
