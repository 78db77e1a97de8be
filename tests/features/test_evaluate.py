"""The evaluator: shared subexpressions, windows from the tree, missing fields, and that a cell depends only on
its own symbol's span (not on other symbols, on values outside the span, or on where the block starts)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError
from kline_store.features.evaluate import evaluate, lookahead, lookback, windows
from kline_store.features.nodes import Call
from kline_store.features.parse import parse
from kline_store.features.sets import alpha158, label

sys.path.insert(0, str(Path(__file__).parent))
from qlib_run import one_thread  # noqa: E402,F401  (an autouse fixture)
from test_ops import EXPRS, make_panel  # noqa: E402


def run(panel: dict, exprs=EXPRS, first=None, last=None) -> np.ndarray:
    values = {str(f): torch.from_numpy(np.ascontiguousarray(panel["values"][k])) for k, f in enumerate(panel["fields"])}
    first = torch.from_numpy(panel["first"] if first is None else first)
    last = torch.from_numpy(panel["last"] if last is None else last)
    return evaluate(exprs, values, first, last).values.numpy()


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), n_sym=st.integers(2, 5), n_bars=st.integers(70, 110), data=st.data())
def test_symbols_do_not_leak_into_each_other(seed, n_sym, n_bars, data):
    panel = make_panel(seed, n_sym, n_bars)
    order = np.array(data.draw(st.permutations(range(n_sym))))
    full = run(panel)
    values = {str(f): torch.from_numpy(panel["values"][k]) for k, f in enumerate(panel["fields"])}
    passes = evaluate(EXPRS, values, torch.from_numpy(panel["first"]), torch.from_numpy(panel["last"]),
                      symbols_per_pass=data.draw(st.integers(1, n_sym)))
    assert same(passes.values.numpy(), full)
    moved = dict(panel, values=panel["values"][:, order], first=panel["first"][order], last=panel["last"][order])
    assert same(run(moved), full[order])


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), before=st.integers(1, 12), after=st.integers(0, 5), garbage=st.floats(-1e3, 1e3))
def test_values_outside_the_span_are_never_read(seed, before, after, garbage):
    """Bars before a symbol's first and after its last hold garbage, not NaN, and the block starts earlier."""
    panel = make_panel(seed, 4, 80)
    f, s, t = panel["values"].shape
    values = np.full((f, s, before + t + after), garbage, dtype=np.float32)
    values[:, :, before: before + t] = panel["values"]
    cols = np.arange(before + t + after)
    first, last = panel["first"] + before, panel["last"] + before
    outside = (cols < first[:, None]) | (cols > last[:, None])
    values[:, outside] = garbage
    out = run(dict(panel, values=values), first=first, last=last)
    assert same(out[:, before: before + t], run(panel))
    assert np.isnan(out[outside]).all()


def test_a_block_with_enough_history_gives_the_full_panel_values():
    """first < 0: the series began before the block; with lookback bars of history the values agree."""
    panel = make_panel(11, 5, 160)
    exprs = [e for e in EXPRS if lookback(parse(e)) is not None]
    back = max(lookback(parse(e)) for e in exprs)
    start = 70
    block = dict(panel, values=panel["values"][:, :, start:])
    full = run(panel, exprs)
    part = run(block, exprs, first=panel["first"] - start, last=panel["last"] - start)
    assert same(part[:, back:], full[:, start + back:])


def test_windows_come_from_the_tree():
    assert (lookback(parse(label()["LABEL0"])), lookahead(parse(label()["LABEL0"]))) == (0, 2)
    assert lookback(parse("Mean(Ref($close, 2), 5)")) == 6
    assert lookback(parse("Corr($close, Ref($volume, 3), 10)")) == 12
    assert lookback(parse("Mean($close, 0)")) is None and lookback(parse("Ref($close, 0)")) is None
    assert lookback(parse("EMA($close, 5)")) is None
    assert lookahead(parse("Mean(Ref($close, -3), 5) - Ref($open, -1)")) == 3
    assert lookahead(parse("Ref(Ref($close, -3), 1)")) == 3  # Ref(-3) then Ref(1) still reads 3 bars ahead
    assert max(lookback(parse(e)) for e in alpha158().values()) == 60
    spans = windows({**alpha158(), **label()})
    assert spans["KMID"] == (0, 0) and spans["ROC60"] == (60, 0) and spans["CORD5"] == (5, 0)
    assert spans["MA60"] == (59, 0) and spans["LABEL0"] == (0, 2)


def test_shared_subexpressions_are_computed_once():
    panel = make_panel(3, 3, 60)
    values = {str(f): torch.from_numpy(panel["values"][k]) for k, f in enumerate(panel["fields"])}
    first, last = torch.from_numpy(panel["first"]), torch.from_numpy(panel["last"])
    res = evaluate({"a": "Mean($close, 5)/$close", "b": "Mean($close,5)", "c": "Mean($close, 5) - Mean($close, 5)"},
                   values, first, last)
    assert res.n_computed == 3 and res.names == ("a", "b", "c")  # Mean, Div, Sub
    assert res.lookback == (4, 4, 4) and res.lookahead == (0, 0, 0)
    assert res.values.shape == (3, 60, 3) and res.values.dtype == torch.float32
    a158 = evaluate(alpha158(), values, first, last)
    calls = [node for e in alpha158().values() for node in _walk(parse(e)) if isinstance(node, Call)]
    assert a158.n_computed == len(set(calls)) < 0.5 * len(calls) and a158.values.shape[-1] == 158


def _walk(node):
    yield node
    for child in getattr(node, "args", ()):
        yield from _walk(child)


def test_missing_fields_read_as_nan_and_are_reported():
    panel = make_panel(5, 3, 50)
    values = {"close": torch.from_numpy(panel["values"][0])}
    res = evaluate(["$vwap/$close", "$close", "Mean($vwap, 5)"], values, torch.from_numpy(panel["first"]),
                   torch.from_numpy(panel["last"]))
    assert res.missing_fields == {"vwap"}
    assert torch.isnan(res.values[..., [0, 2]]).all() and not torch.isnan(res.values[..., 1]).all()


def test_bad_inputs_are_input_errors():
    with pytest.raises(InputError, match="position 14"):
        evaluate(["Mean($close, 5"], {"close": torch.zeros(2, 3)}, torch.zeros(2), torch.ones(2))
    with pytest.raises(InputError, match=r"must all be \[symbols, bars\]"):
        evaluate(["$close"], {"close": torch.zeros(3)}, torch.zeros(1), torch.ones(1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_gives_the_cpu_values():
    panel = make_panel(9, 4, 120)
    values = {str(f): torch.from_numpy(panel["values"][k]) for k, f in enumerate(panel["fields"])}
    first, last = torch.from_numpy(panel["first"]), torch.from_numpy(panel["last"])
    cpu = evaluate(EXPRS, values, first, last).values.numpy()
    gpu = evaluate(EXPRS, {k: v.cuda() for k, v in values.items()}, first.cuda(), last.cuda()).values.cpu().numpy()
    assert same(gpu, cpu)
