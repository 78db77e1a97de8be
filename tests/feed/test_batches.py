"""batches.py: counting samples of any batch shape, mapping over tensors, cutting a chunk into batches."""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from kline_store.feed.batches import batch_length, leaves, map_tensors, slices


def test_slices_and_map_keep_structure():
    x = np.arange(10)
    batch = {"x": x, "pair": (x * 2, [x * 3])}
    parts = list(slices(batch, [4, 4, 2]))
    assert [n for _, n in parts] == [4, 4, 2]
    assert [len(p["x"]) for p, _ in parts] == [4, 4, 2]
    assert parts[2][0]["pair"][1][0].tolist() == [24, 27]
    flat = list(slices({"x": x, "y": x + 1}, [7, 3]))  # the dict fast path
    assert flat[1][0]["y"].tolist() == [8, 9, 10] and flat[1][1] == 3
    assert np.shares_memory(flat[0][0]["x"], x)      # views, not copies
    assert list(slices(x, [10]))[0][0] is x
    assert len(leaves(batch)) == 3
    Pair = namedtuple("Pair", "a b")
    doubled = map_tensors(lambda t: t * 2, Pair(x, "label"))
    assert isinstance(doubled, Pair) and doubled.a[1] == 2 and doubled.b == "label"


def test_batch_length_of_common_shapes():
    x = np.zeros((5, 3))
    assert batch_length(x) == 5 and batch_length({"x": x}) == 5 and batch_length((x, x)) == 5
    assert batch_length([1, 2, 3]) == 3 and batch_length({}) == 0 and batch_length([]) == 0
    assert batch_length(np.float32(1)) == 1 and batch_length(object()) == 1
