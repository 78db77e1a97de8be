"""samples/cross_section.py: a CrossSectionDataset loader's state carries the store version and is refused on
another (issue 26: a state taken on version 1 resumed on a revised version 2, 152 of 152 remaining batches
different), and resumes exactly on its own. (Cross-sections' windows and padding: test_dataset.py,
test_loader.py; their block order: test_day_blocks.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import kline_store as ks
from kline_store.errors import InputError
from helpers_dataset_ref import make_store, random_panel


def revised_store(path: Path) -> tuple[Path, ks.Store]:
    """A store of version 2 whose last 10 days' highs and closes were revised: the same samples (positions), other
    values; and an open reader of version 1 (which keeps it from gc while the tests run)."""
    p = make_store(path, random_panel(np.random.default_rng(3), 6, 80, holes=0.0))
    st = ks.open_store(p)
    rows = [f"{sym},{st.dates[t]},{o},{h * 1.1},{lo},{c * 1.05},{v},{a}\n"
            for s, sym in enumerate(st.symbols) for t in range(70, 80)
            for o, h, lo, c, v, a in [st.panel[s, t].tolist()] if np.isfinite(c)]
    csv = path.parent / "revision.csv"
    csv.write_text("symbol,date,open,high,low,close,volume,amount\n" + "".join(rows))
    ks.append(p, [csv])
    return p, st


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path, pin = revised_store(tmp_path_factory.mktemp("xs") / "s")
    yield path
    pin.close()


def test_a_state_carries_the_version_and_is_refused_on_another(store):
    old = ks.CrossSectionDataset(store, window=5, version=1)
    new = ks.CrossSectionDataset(store, window=5)
    assert (old.version, new.version) == (1, 2) and len(old) == len(new)
    ld = old.loader(batch_size=4, seed=2, num_workers=0)
    it = iter(ld)
    head = [next(it) for _ in range(3)]
    state = ld.state_dict()
    assert state["version"] == 1
    with pytest.raises(InputError, match=r"taken on store version 1; this dataset reads version 2: open the dataset "
                                         r"with version=1") as e:
        new.loader(batch_size=4, seed=2, num_workers=0).load_state_dict(state)
    assert "\n" not in str(e.value)
    again = ks.CrossSectionDataset(store, window=5, version=1).loader(batch_size=4, seed=2, num_workers=0)
    again.load_state_dict(state)
    whole = list(old.loader(batch_size=4, seed=2, num_workers=0))
    rest = list(again)
    assert len(head) + len(rest) == len(whole)
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(head + rest, whole))
