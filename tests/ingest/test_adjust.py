"""The adjustment-factor policy: fields, sources, event factors, rebasing, bad adjustment data."""

import numpy as np
import polars as pl
import pytest

from conftest import write
from kline_store.ingest import adjust
from kline_store import ingest, open_store


def test_store_fields_and_factor_source():
    assert adjust.store_fields(["close", "open", "volume"]) == ["open", "close", "volume"]
    assert adjust.store_fields(["close", "adj_close"]) == ["close", "adj_close", "adj_factor"]       # Yahoo
    assert adjust.store_fields(["close", "split", "dividend"]) == ["close", "split", "dividend", "adj_factor"]
    assert adjust.store_fields(["adj_factor", "close", "pre_close"]) == ["close", "pre_close", "adj_factor"]
    assert adjust.factor_source(["close"]) is None
    assert adjust.factor_source(["close", "adj_factor"]) == adjust.INPUT
    assert adjust.factor_source(["close", "split_ratio", "ex_dividend", "adj_factor"]) == adjust.EVENTS


def test_source_after_append():
    assert adjust.source_after_append(None, ["close"], ["close", "adj_factor"]) == (["adj_factor"], adjust.INPUT)
    assert adjust.source_after_append(None, ["close"], ["close", "split"]) == (["split", "adj_factor"], adjust.EVENTS)
    assert adjust.source_after_append(adjust.EVENTS, ["close", "split", "adj_factor"], ["close", "split"]) == ([], adjust.EVENTS)


def test_event_factor_of_a_split_and_a_dividend():
    close = np.array([[70.0, 71.0, 10.2, 10.0, 9.0]])
    split = np.array([[np.nan, np.nan, 7.0, 1.0, -2.0]])            # -2: bad data, ignored
    div = np.array([[0.0, 0.0, 0.0, 0.0, 1.0]])
    f = adjust.cumulative_factor(adjust.event_ratios(close, split, div), np.isfinite(close))
    assert f[0].tolist() == pytest.approx([1, 1, 7, 7, 7 * 10 / 9])


def test_continuing_from_a_state_gives_the_bits_of_the_whole_history():
    rng = np.random.default_rng(0)
    ratio = 1 + rng.random((3, 50)) / 10
    present = rng.random((3, 50)) > 0.2
    whole = adjust.cumulative_factor(ratio, present)
    head = adjust.cumulative_factor(ratio[:, :30], present[:, :30])
    tail = adjust.cumulative_factor(ratio[:, 30:], present[:, 30:], start=np.cumprod(ratio[:, :30], axis=1)[:, -1])
    assert np.array_equal(np.concatenate([head, tail], axis=1), whole, equal_nan=True)


def test_rebase_to_the_first_bar():
    f = np.array([[np.nan, 4.0, 8.0], [np.nan, np.nan, np.nan]])
    assert adjust.rebase(f).tolist()[0] == 4.0 and f[0, 1:].tolist() == [1.0, 2.0] and np.isnan(f[1]).all()


def test_bad_adjustment_data_is_flagged_and_never_a_factor():
    df = pl.DataFrame({"close": [10.0, 10.0, 10.0, 10.0], "adj_close": [8.0, -1.0, 0.0, 9.0],
                       "split": [1.0, 1.0, 1.0, -7.0]})
    lf, fields = adjust.with_input_factor(df.lazy(), ["close", "adj_close", "split"])
    out = lf.collect()
    assert out.select(adjust.bad_data(fields).alias("bad"))["bad"].to_list() == [False, True, True, True]
    assert adjust.clean(out)["adj_factor"].to_list() == [0.8, None, None, 0.9]


def test_a_placeholder_adj_close_is_reported_and_left_without_factor(real, tmp_path):
    """Case 8: a -1 placeholder in Adj Close (a common vendor filler) gave a negative adj_factor silently."""
    lines = (real / "us_yahoo_daily" / "AAPL.csv").read_text().splitlines()
    for i in (100, 101, 700):
        cells = lines[i].split(",")
        cells[5] = "-1" if i != 700 else "0"
        lines[i] = ",".join(cells)
    write(tmp_path / "AAPL.csv", "\n".join(lines) + "\n")
    rep = ingest([tmp_path / "AAPL.csv"], tmp_path / "s")
    p = next(p for p in rep.problems if p.kind == "bad_adjustment")
    assert p.count == 3 and p.examples[0].startswith(f"AAPL {lines[100][:10]} (") and "line 101" in p.examples[0]
    f = open_store(tmp_path / "s").array("adj_factor")[0]
    assert np.isnan(f[[99, 100, 699]]).all() and (f[np.isfinite(f)] > 0).all()
    assert np.isfinite(f).sum() == len(lines) - 1 - 3


@pytest.mark.parametrize("split", ["1e30", "1e-30"])
def test_absurd_split_ratios_are_reported_and_never_an_infinite_or_zero_factor(tmp_path, split):
    """Two splits of 1e30 once stored adj_factor=inf (with a numpy overflow warning); 1e-30s gave 0.0."""
    rows = "".join(f"2024-01-0{d},1,2,0.5,1.5,100,0,{s}\n" for d, s in ((2, 1), (3, split), (4, split), (5, 2)))
    write(tmp_path / "Z.csv", "date,open,high,low,close,volume,dividend,split\n" + rows)
    rep = ingest([tmp_path / "Z.csv"], tmp_path / "s")
    p = next(p for p in rep.problems if p.kind == "bad_adjustment")
    assert p.count == 2 and "line 3" in p.examples[0]
    f = open_store(tmp_path / "s").array("adj_factor")[0]
    assert f.tolist() == [1.0, 1.0, 1.0, 2.0]          # the absurd events ignored, the real 2:1 split kept


def test_a_factor_outside_any_price_scale_is_not_stored():
    panel = np.full((1, 3, 3), np.nan, dtype=np.float32)
    panel[0, :, 0] = 1.5                                   # close
    panel[0, :, 1] = [1.0, 1e6, 1e6]                       # split ratios at the top of their range
    fields = ["close", "split", "adj_factor"]
    adjust.fill_event_factor(panel, fields, start=np.array([1e25]))
    assert np.isfinite(panel[0, 0, 2]) and np.isnan(panel[0, 1:, 2]).all()   # 1e31, 1e37: beyond FACTOR_RANGE
