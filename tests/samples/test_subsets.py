"""Datasets on a symbol subset, partial dates as pandas reads them, and one name per split (val / valid), on
real A-share and US daily bars."""

from __future__ import annotations

import numpy as np
import pytest

from kline_store import ingest
from kline_store.errors import InputError
from kline_store.samples.cross_section import CrossSectionDataset
from kline_store.samples.dataset import KlineDataset
from kline_store.samples.ranges import date_bounds
from kline_store.samples.splits import make_splits
from kline_store.store import open_store


@pytest.fixture(scope="module")
def us(real, tmp_path_factory):
    path = tmp_path_factory.mktemp("subsets") / "us"
    ingest([real / "us_yahoo_daily" / f"{s}.csv" for s in ("AAPL", "MSFT", "GOOG", "ORCL", "INTC")], path)
    return path


def test_symbols_subset_is_the_full_dataset_filtered(us):
    full = KlineDataset(us, window=20)
    st = open_store(us)
    pick = ["MSFT", "ORCL"]
    sub = KlineDataset(us, window=20, symbols=pick)
    rows = [st.symbols.index(s) for s in pick]
    s_full, _ = full.locate(np.arange(len(full)))
    want = full.valid_index()[np.isin(s_full, rows)]
    np.testing.assert_array_equal(sub.valid_index(), want)
    s, _ = sub.locate(np.arange(len(sub)))
    assert set(s.tolist()) == set(rows)
    a, b = sub[0], full[int(np.searchsorted(full.valid_index(), sub.valid_index()[0]))]
    assert int(a["symbol"]) == int(b["symbol"]) and torch_equal(a["x"], b["x"])


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_unknown_symbol_is_one_line(us):
    with pytest.raises(InputError, match=r"no symbol 'NOPE' among its 5 symbols") as e:
        KlineDataset(us, window=20, symbols=["MSFT", "NOPE"])
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="listed twice"):
        KlineDataset(us, window=20, symbols=["MSFT", "MSFT"])


def test_cross_section_and_splits_on_a_subset(us):
    cs = CrossSectionDataset(us, window=20, symbols=["AAPL", "GOOG"])
    assert max(len(cs.day_windows(i)) for i in range(len(cs))) == 2
    sp = make_splits(us, train=("2013", "2014"), val=("2015", "2015"), test=("2016", None), window=20,
                     symbols=["INTC"])
    st = open_store(us)
    for ds in sp:
        s, _ = ds.locate(np.arange(len(ds)))
        assert set(s.tolist()) == {st.symbols.index("INTC")}
    assert sp.val is sp.valid


def test_partial_dates_cover_their_period(us):
    dates = open_store(us).dates
    lo, hi = date_bounds(dates, "2013", "2013")
    assert str(dates[lo]) == "2013-01-02" and str(dates[hi]) == "2013-12-31"
    lo, hi = date_bounds(dates, "2013-03", "2013-03")
    assert str(dates[lo]) == "2013-03-01" and str(dates[hi]) == "2013-03-28"   # Good Friday 2013-03-29
    assert date_bounds(dates, None, 2012)[1] == date_bounds(dates, None, "2012-12-31")[1]
    ds = KlineDataset(us, window=5, horizon=1, end="2012")
    assert str(dates[ds.label_days(np.arange(len(ds))).max()]) == "2012-12-31"


def test_val_and_valid_are_one_split(us):
    a = make_splits(us, train=("2013", "2014"), valid=("2015", "2015"), window=20)
    b = make_splits(us, train=("2013", "2014"), val=("2015", "2015"), window=20)
    np.testing.assert_array_equal(a.valid.valid_index(), b.val.valid_index())
    with pytest.raises(InputError, match="valid= and val= are the same split"):
        make_splits(us, train=("2013", "2014"), valid=("2015", None), val=("2015", None), window=20)


def test_a_symbol_subset_with_the_block_index(tmp_path):
    """The O(blocks) index (issue 17) keeps only the chosen symbols' windows, as the full index does."""
    import numpy as np
    from helpers_dataset_ref import make_store, random_panel
    from kline_store import KlineDataset
    store = make_store(tmp_path / "s", random_panel(np.random.default_rng(3), 6, 300))
    names = KlineDataset(store, window=8).symbols
    pick = [names[1], names[4]]
    full = KlineDataset(store, window=8, symbols=pick, index="full")
    blocks = KlineDataset(store, window=8, symbols=pick, index="blocks")
    assert len(full) == len(blocks) > 0
    s, t = blocks.locate(np.arange(len(blocks)))
    fs, ft = full.locate(np.arange(len(full)))
    assert sorted(zip(s.tolist(), t.tolist())) == sorted(zip(fs.tolist(), ft.tolist()))
    assert set(s.tolist()) == {1, 4}
