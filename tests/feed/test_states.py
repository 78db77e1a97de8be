"""feed/states.py: a loader state is untrusted input (a checkpoint anyone may have edited). Every key of ours with a
value of the wrong type or range is one line naming the key and the value, an InputError (issue 26: ``epoch='x'``,
``block_bytes='abc'`` and NaN raised ValueError), and the loader is left as it was: it still delivers its epoch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kline_store as ks
from kline_store.errors import InputError
from kline_store.feed.states import check_state
from helpers_dataset_ref import make_store, random_panel

BAD = [("epoch", "x"), ("epoch", -1), ("epoch", math.nan), ("epoch", math.inf), ("epoch", 1.5), ("epoch", True),
       ("epoch", None), ("epoch", [0]), ("epoch", 1 << 70), ("position", "0"), ("position", -3), ("position", math.nan),
       ("n", "abc"), ("n", {"a": 1}), ("seed", "abc"), ("seed", math.nan), ("seed", 2.5), ("rank", 1.5),
       ("rank", -1), ("world_size", 0), ("world_size", "2"), ("batch_size", 0), ("shuffle", "yes"),
       ("shuffle", 1), ("drop_last", None), ("tail", 3), ("order", ["blocks"]), ("version", "x"), ("version", 0),
       ("version", math.nan)]
BAD_BLOCKS = [("block_bytes", "abc"), ("block_bytes", -5), ("block_bytes", math.nan), ("pool", math.nan),
              ("pool", 0), ("lifetime", "8"), ("n_blocks", -1)]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = make_store(tmp_path_factory.mktemp("states") / "s", random_panel(np.random.default_rng(4), 12, 300))
    return ks.KlineDataset(path, window=8, horizon=1)


def keys(batches) -> list[int]:
    return torch.cat([b["symbol"] * 1000 + b["t"] for b in batches]).tolist()


@pytest.mark.parametrize("order, key, value", [("uniform", k, v) for k, v in BAD] +
                         [("blocks", k, v) for k, v in BAD + BAD_BLOCKS])
def test_a_bad_value_is_one_line_naming_it_and_changes_nothing(ds, order, key, value):
    make = lambda: ds.loader(batch_size=64, order=order, pool_blocks=8, num_workers=0, seed=5)   # noqa: E731
    ld = make()
    first = next(iter(ld))
    state = ld.state_dict()
    with pytest.raises(InputError) as e:
        ld.load_state_dict({**state, key: value})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"loader state has {key}=")
    assert repr(value)[:30] in msg or key == "epoch" and value == 1 << 70
    rest = keys(ld)                                            # the position it had: the epoch's remaining batches
    assert keys([first]) + rest == keys(make())


def test_not_a_dict_is_one_line():
    for state in ([1, 2], "epoch=3", None, 7):
        with pytest.raises(InputError, match=f"loader state is a {type(state).__name__}; expected a dict"):
            check_state(state)


def test_good_values_pass_and_whole_floats_become_ints(ds):
    ld = ds.loader(batch_size=64, num_workers=0)
    state = ld.state_dict()
    assert check_state(state) == state
    assert check_state({**state, "epoch": 2.0, "position": np.int64(64)})["epoch"] == 2
    assert check_state({**state, "block_bytes": None, "future_key": object()})["block_bytes"] is None
    ld.load_state_dict({**state, "epoch": 1.0})
    assert ld.epoch == 1 and isinstance(ld.epoch, int)
