"""measure/footprint.py, and what it found (issue 26 part 5): a default loader's process held the store's stored
days twice (its own mapping of the store beside the gathers' private one) and the rows' reserved room with them
(read with the stored days, and mapped with them in large folios): on a 114 MB panel its RSS grew by 375 MiB
(545 MiB from a cold page cache) where index, two orders, buffers and the stored days once make 207 MiB. Now the
store's pages are mapped once and the room is neither cached nor mapped. Memory, not time, is asserted."""

from __future__ import annotations

import os

import pytest

from kline_store.measure import footprint, synthetic
from kline_store.measure.footprint import MIB


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return synthetic.make_store(tmp_path_factory.mktemp("fp") / "s", 500, 2500, seed=1)   # 29 MiB, room 2x


@pytest.mark.parametrize("cold", [True, False])
def test_a_default_loader_takes_its_allowance_and_the_stored_days_once(store, cold):
    fp = footprint.measure(store, window=64, batch_size=256, cold=cold)
    end = fp.end
    assert fp.windows > 1_000_000 and fp.index and fp.orders == 2 * fp.index and fp.buffers >= 8 * MIB
    assert fp.private() <= fp.allowance + 16 * MIB     # anonymous: index, orders, buffers (and a chunk's temporaries)
    assert end["store"] <= 1.1 * fp.panel + MIB                           # the stored days, mapped once
    assert fp.cached <= 1.1 * fp.panel + MIB                              # no reserved room in the page cache
    assert end["VmRSS"] <= fp.allowance + 1.1 * fp.panel + 32 * MIB       # and some library pages
    text = "\n".join(footprint.describe(fp))
    assert "against an allowance of" in text and "RSS growth" in text


def test_the_steps_are_reported_in_order(store):
    got = footprint.measure(store, window=32, batch_size=512)
    assert list(got.steps) == ["dataset", "loader", "first batch", "first epoch"]
    assert got.steps["dataset"]["RssAnon"] >= 0.9 * got.index                # the index is made with the dataset
    assert footprint.cached_bytes(os.devnull) == 0
