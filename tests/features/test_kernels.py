"""The compiled (numba) kernels against the torch operators they replace on the CPU, cell for cell: the same
values bit for bit (NaN where torch has NaN), for every operator that reads them, over random panels with NaN
runs, rows outside the span, flat windows, ties, +-0 and +-inf, windows from 1 to longer than the block."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError
from kline_store.features import kernels
from kline_store.features.ops import apply
from kline_store.features.window import Span, mask

pytestmark = pytest.mark.skipif(kernels._load() is False, reason="numba is not installed")

SINGLE = ["Quantile", "Med", "Rank", "IdxMax", "IdxMin", "Max", "Min", "Mean", "Sum", "Std", "Var", "Count",
          "Slope", "Rsquare", "Resi", "Skew", "Kurt", "Mad", "WMA", "EMA"]
PAIRED = ["Corr", "Cov"]
SPECIAL = [0.0, -0.0, 1.0, 2.5, -3.0, 1e6, 1e-30, float("inf"), float("-inf")]


@st.composite
def panels(draw):
    n_sym = draw(st.integers(1, 4))
    n_bars = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base = np.round(rng.normal(0, 3, (n_sym, n_bars)), draw(st.sampled_from([0, 1, 6])))  # ties when rounded
    pick = rng.uniform(size=base.shape)
    nan_rate, special_rate = draw(st.sampled_from([0.0, 0.1, 0.4])), draw(st.sampled_from([0.0, 0.05, 0.2]))
    base = np.where(pick < special_rate, rng.choice(SPECIAL, size=base.shape), base)
    base = np.where(pick > 1 - nan_rate, np.nan, base)
    if draw(st.booleans()) and n_bars > 4:  # a flat run
        at = rng.integers(0, n_bars - 3)
        base[:, at: at + rng.integers(2, n_bars - at + 1)] = base[:, at: at + 1]
    first = rng.integers(-3, max(1, n_bars // 2), n_sym)
    last = np.maximum(first, rng.integers(n_bars // 2, n_bars + 3, n_sym))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return torch.from_numpy(base).to(dtype), torch.from_numpy(first), torch.from_numpy(last)


def _run(engine: str, monkeypatch, op: str, args: list, params: tuple, first, last) -> torch.Tensor:
    monkeypatch.setenv("KLINE_STORE_KERNELS", engine)
    span = Span(first, last, args[0].shape[1])
    return apply(op, [mask(a, span) for a in args], params, span)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and np.array_equal(a.numpy(), b.numpy(), equal_nan=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(panel=panels(), other=panels(), op=st.sampled_from(SINGLE + PAIRED), n=st.integers(0, 45),
       q=st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0, 0.33]))
def test_compiled_equals_torch(monkeypatch, panel, other, op, n, q):
    x, first, last = panel
    args = [x]
    if op in PAIRED:
        y = other[0]
        y = torch.nn.functional.pad(y, (0, max(0, x.shape[1] - y.shape[1])))[:1, : x.shape[1]].expand_as(x)
        args = [x, y.contiguous().to(x.dtype)]
    n = max(n, 1) if op == "Rank" and n == 0 else n
    params = (n, q) if op == "Quantile" else (n,)
    if op == "EMA" and 0 < q < 1:
        params = (q,)  # EMA's alpha form
    want = _run("torch", monkeypatch, op, args, params, first, last)
    got = _run("numba", monkeypatch, op, args, params, first, last)
    assert _same(want, got), (op, params, want, got)


def test_engine_switch(monkeypatch):
    monkeypatch.setenv("KLINE_STORE_KERNELS", "torch")
    assert kernels.engine() == "torch"
    monkeypatch.setenv("KLINE_STORE_KERNELS", "numba")
    assert kernels.engine() == "numba"
    assert kernels.compiled_for(torch.zeros(2, 2)) is not None
    monkeypatch.setenv("KLINE_STORE_KERNELS", "fast")
    with pytest.raises(InputError, match="KLINE_STORE_KERNELS"):
        kernels.engine()
    monkeypatch.setattr(kernels, "_compiled", False)  # as when numba does not import: torch, or one line
    monkeypatch.delenv("KLINE_STORE_KERNELS")
    assert kernels.engine() == "torch" and kernels.compiled_for(torch.zeros(2, 2)) is None
    monkeypatch.setenv("KLINE_STORE_KERNELS", "numba")
    with pytest.raises(InputError, match="pip install"):
        kernels.engine()


def test_threads_give_the_same_values():
    """Symbol blocks run side by side: the values do not depend on the thread count, torch's own thread
    count is the caller's again afterwards, and a bad count is refused."""
    from kline_store.features.evaluate import MIN_TASK_SYMBOLS, evaluate
    from kline_store.features.sets import alpha158

    rng = np.random.default_rng(7)
    n_sym, n_bars = 3 * MIN_TASK_SYMBOLS + 5, 80
    close = np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_bars)), axis=1)).astype(np.float32)
    close[rng.uniform(size=close.shape) < 0.05] = np.nan
    vals = {"close": torch.from_numpy(close), "open": torch.from_numpy(close * 1.01),
            "high": torch.from_numpy(close * 1.02), "low": torch.from_numpy(close * 0.98),
            "volume": torch.from_numpy(np.round(close * 1e4)), "vwap": torch.from_numpy(close)}
    first, last = torch.from_numpy(rng.integers(0, 20, n_sym)), torch.full((n_sym,), n_bars - 1)
    exprs = dict(list(alpha158().items())[::7])
    before = torch.get_num_threads()
    one = evaluate(exprs, vals, first, last, threads=1).values
    assert torch.get_num_threads() == before
    for threads in (2, 3):
        many = evaluate(exprs, vals, first, last, threads=threads).values
        assert np.array_equal(one.numpy(), many.numpy(), equal_nan=True)
        assert torch.get_num_threads() == before
    with pytest.raises(InputError, match="threads"):
        evaluate(exprs, vals, first, last, threads=0)


def test_the_garbage_collector_is_paused_during_a_pass_only():
    """evaluate pauses Python's cyclic collector while its blocks run and leaves it as the caller had it."""
    import gc

    from kline_store.features import evaluate as ev

    x = torch.rand(3, 30)
    first, last = torch.zeros(3, dtype=torch.long), torch.full((3,), 29)
    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            ev.evaluate({"A": "Mean($close, 5)"}, {"close": x}, first, last, threads=1)
            assert gc.isenabled() is state
            with ev._one_intra_op_thread():
                assert not gc.isenabled()
            assert gc.isenabled() is state
    finally:
        (gc.enable if was else gc.disable)()


def test_evaluate_reuses_a_buffer_it_is_given():
    """out=: the values land in the leading part of a large enough buffer (same values as without one); a
    buffer of another shape or dtype is left alone."""
    from kline_store.features.evaluate import evaluate

    x = torch.rand(5, 40)
    x[1, 3:9] = float("nan")
    first, last = torch.zeros(5, dtype=torch.long), torch.full((5,), 39)
    exprs = {"A": "Mean($close, 5)", "B": "Skew($close, 10)"}
    want = evaluate(exprs, {"close": x}, first, last, threads=1).values
    buf = torch.full((2, 8, 40), 7.0)
    got = evaluate(exprs, {"close": x}, first, last, threads=1, out=buf).values
    assert got.data_ptr() == buf.data_ptr() and _same(want, got)
    small = torch.full((2, 4, 40), 7.0)
    got = evaluate(exprs, {"close": x}, first, last, threads=1, out=small).values
    assert got.data_ptr() != small.data_ptr() and _same(want, got) and bool((small == 7).all())
