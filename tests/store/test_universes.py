"""store/universes.py: membership spans on a calendar (cells, masks) against a plain reference, and the manifest's
universes checked like every other key (a universe read back from disk is untrusted)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError, StoreError
from kline_store.store import create_store, open_store
from kline_store.store import manifest as mf
from kline_store.store import universes

DAYS = np.array(["2020-01-02", "2020-01-03", "2020-01-06", "2020-01-07", "2020-01-08", "2020-01-10",
                 "2020-01-13", "2020-01-14"], dtype="datetime64[D]")
SYMS = ["A", "B", "C"]


@st.composite
def spans(draw, symbols=SYMS, lo="2019-12-25", days=30):
    """Random spans: per symbol up to three, apart and ascending, the last one perhaps open."""
    out: universes.Spans = {}
    base = np.datetime64(lo, "D")
    for s in symbols:
        cuts = sorted(draw(st.sets(st.integers(0, days), max_size=6)))
        pairs = list(zip(cuts[::2], cuts[1::2]))
        if not pairs:
            continue
        items = [(base + a, base + b) for a, b in pairs]
        if draw(st.booleans()):
            items[-1] = (items[-1][0], None)
        # apart: a span starts after the previous one ends (cuts are distinct, so a < b <= next a)
        items = [(a, b) for k, (a, b) in enumerate(items) if k == 0 or a > items[k - 1][1]]
        out[s] = items
    return out


def reference(sp: universes.Spans, symbols: list[str], days: np.ndarray) -> np.ndarray:
    out = np.zeros((len(symbols), len(days)), dtype=bool)
    for s, items in sp.items():
        for a, b in items:
            for t, d in enumerate(days):
                if a <= d and (b is None or d <= b):
                    out[symbols.index(s), t] = True
    return out


@settings(max_examples=150, deadline=None)
@given(sp=spans(), d0=st.integers(0, 8), d1=st.integers(0, 8), data=st.data())
def test_membership_on_a_calendar_is_the_spans(sp, d0, d1, data):
    u = universes.from_spans(sp, SYMS, DAYS.astype(np.int64))
    want = reference(sp, SYMS, DAYS)
    np.testing.assert_array_equal(u.dense(), want)
    flat = np.arange(len(SYMS) * len(DAYS))
    np.testing.assert_array_equal(u.contains(flat), want.reshape(-1))
    rows = np.array(data.draw(st.lists(st.integers(0, 2), max_size=4, unique=True)), dtype=np.int64)
    a, b = min(d0, d1), max(d0, d1)
    np.testing.assert_array_equal(u.mask(rows, a, b), want[rows][:, a:b])
    np.testing.assert_array_equal(u.mask(slice(1, 3), a, b), want[1:3, a:b])
    s = u.summary()
    assert s["symbols"] == int(want.any(axis=1).sum()) and s["members_last_day"] == int(want[:, -1].sum())
    decoded = universes.decode(universes.encode(sp))
    assert decoded == {k: v for k, v in sp.items() if v}


def test_names():
    assert universes.check_name("csi300") == "csi300"
    for bad in ("CSI300", "all", "", "a/b", "x" * 65, "..", 7):
        with pytest.raises(InputError, match="universe"):
            universes.check_name(bad)


@pytest.fixture
def store(tmp_path):
    panel = np.random.default_rng(1).normal(size=(3, len(DAYS), 2)).astype(np.float32)
    path = tmp_path / "s"
    create_store(path, panel, SYMS, DAYS, ["close", "volume"],
                 extra={"universes": {"idx": universes.encode({"A": [(DAYS[1], DAYS[3]), (DAYS[5], None)],
                                                        "C": [(np.datetime64("2019-01-01"), DAYS[0])]}, "test")}})
    return path


def test_a_store_holds_its_universes(store):
    st_ = open_store(store)
    assert st_.universes == ["idx"]
    u = st_.universe("idx")
    assert u.dtype == bool and not u.flags.writeable
    assert u.tolist() == [[False, True, True, True, False, True, True, True], [False] * 8, [True] + [False] * 7]
    assert st_.info()["universes"] == {"idx": {"symbols": 2, "spans": 3, "members_last_day": 1}}
    with pytest.raises(InputError, match=r"no universe 'nope'; its universes: idx"):
        st_.universe("nope")


def tamper(store, edit) -> None:
    """Edit the manifest and reseal its checksum: only the schema check can catch it."""
    path = store / "manifest.json"
    m = json.loads(path.read_text())
    edit(m["universes"])
    path.write_text(json.dumps(mf.seal(m)))


@pytest.mark.parametrize("edit, what", [
    (lambda u: u.update({"ALL": u["idx"]}), "is not a universe name"),
    (lambda u: u["idx"]["spans"].update({"Z": [["2020-01-02", None]]}), "names no symbol"),
    (lambda u: u["idx"]["spans"].update({"B": [["2020-01-06", "2020-01-03"]]}), "after it ends"),
    (lambda u: u["idx"]["spans"].update({"B": [["2020-01-02", None], ["2020-01-06", None]]}), "overlaps"),
    (lambda u: u["idx"]["spans"].update({"B": [["2020-01-06", "2020-01-08"], ["2020-01-07", None]]}), "overlaps"),
    (lambda u: u["idx"]["spans"].update({"B": [["2020-1-6", None]]}), "YYYY-MM-DD"),
    (lambda u: u["idx"]["spans"].update({"B": [["2020-01-06"]]}), "is not a \\[first, last\\] span"),
    (lambda u: u["idx"]["spans"].update({"B": []}), "non-empty list"),
    (lambda u: u["idx"].update({"spans": [1]}), "is not a universe"),
    (lambda u: u["idx"].update({"source": 5}), "is not a string"),
    (lambda u: u["idx"]["spans"].update({"B": [["2301-01-06", None]]}), "1800-01-01..2200-12-31"),
])
def test_a_crafted_universe_is_refused_naming_the_key(store, edit, what):
    tamper(store, edit)
    with pytest.raises(StoreError, match=what) as e:
        open_store(store)
    assert "manifest key 'universes" in str(e.value) and "\n" not in str(e.value)


def test_a_checksum_catches_an_edited_span(store):
    path = store / "manifest.json"
    path.write_text(path.read_text().replace('"2020-01-03"', '"2020-01-02"'))
    with pytest.raises(StoreError, match="manifest_checksum"):
        open_store(store)
