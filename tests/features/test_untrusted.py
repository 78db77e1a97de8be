"""Expressions are untrusted text: folding within float range, windows clamped to the series, deep and long
expressions without recursion, numbers where Qlib needs a series refused, limits on text size and count.
Every case is a value or one KlineStoreError line, within seconds."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError, KlineStoreError
from kline_store.features.evaluate import MAX_EXPRESSIONS, evaluate, lookback
from kline_store.features.nodes import Call, Const, Field
from kline_store.features.parse import MAX_EXPRESSION_CHARS, MAX_WINDOW, parse
from kline_store.features.plan import make_plan

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402
from qlib_run import one_thread, qlib_python  # noqa: E402,F401  (one_thread: an autouse fixture)
from test_ops import make_panel  # noqa: E402
from test_compute import bars, write_folder  # noqa: E402


def _panel(n_sym: int = 3, n_bars: int = 60, seed: int = 0) -> tuple[dict, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    close = 10 * np.exp(np.cumsum(rng.normal(0, 0.02, (n_sym, n_bars)), axis=1))
    volume = np.round(rng.lognormal(8, 1, (n_sym, n_bars)), -2)
    close[1, 10:14] = np.nan  # a suspension
    values = {"close": torch.tensor(close, dtype=torch.float32), "volume": torch.tensor(volume, dtype=torch.float32)}
    first = torch.tensor([0, 5, 20][:n_sym] + [0] * max(0, n_sym - 3))
    return values, first, torch.full((n_sym,), n_bars - 1)


def _values(exprs, panel=None) -> np.ndarray:
    values, first, last = panel or _panel()
    return evaluate(exprs, values, first, last).values.permute(2, 0, 1).numpy()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


# --- constant folding within float range -------------------------------------------------------------

@pytest.mark.parametrize("expr, value", [
    ("$close+9**9**9", math.inf), ("$close+10**400", math.inf), ("$close+(-10**400)", -math.inf),
    ("$close+(-2)**10001", -math.inf), ("$close+1**(10**30)", 1), ("$close+(-1)**(10**30+1)", -1),
    ("$close+10.0**400", math.inf), ("$close+(-8)**(1/3)", math.nan), ("$close+1" + "0" * 5000, math.inf),
    ("$close+1e999", math.inf), ("$close+10**300*10**300", math.inf), ("$close+2**10", 1024),
    ("$close+1/0", math.nan), ("$close+(10**400 > 5)", 1.0), ("$close+(6 & 3)", 2), ("$close+(6 | 3)", 7),
])
def test_numbers_fold_within_float_range(expr, value):
    tree = parse(expr)
    folded = tree.args[1]
    assert isinstance(folded, Const) and not isinstance(folded.value, complex)
    assert (math.isnan(value) and math.isnan(folded.value)) or folded.value == value
    out = _values([expr])[0]  # evaluates as $close plus that float: no complex cast, no OverflowError
    values, first, last = _panel()
    with np.errstate(all="ignore"):
        want = values["close"].numpy().astype(np.float32) + np.float32(value)
    t = np.arange(60)
    span = (t >= first.numpy()[:, None]) & (t <= last.numpy()[:, None])
    assert _same(out[span], want[span])


# --- windows clamped to the series ---------------------------------------------------------------

EXPANDING = ["Mean", "Sum", "Std", "Var", "Max", "Min", "IdxMax", "IdxMin", "Med", "Mad", "Rank", "Count", "Slope",
             "Resi", "WMA", "Skew", "Kurt"]


@pytest.mark.parametrize("op", EXPANDING)
def test_a_window_longer_than_the_series_is_the_expanding_one(op):
    """Bit for bit what N = 0 (Qlib's expanding) gives, for 60-bar series and N up to MAX_WINDOW."""
    got = _values([f"{op}($close, 100000000)", f"{op}($close, {MAX_WINDOW})", f"{op}($close, 0)"])
    assert _same(got[0], got[2]) and _same(got[1], got[2]), op


@pytest.mark.parametrize("expr, same_as", [
    ("Quantile($close, 3000000, 0.3)", "Quantile($close, 0, 0.3)"),
    ("Corr($close, $volume, 200000)", "Corr($close, $volume, 60)"),
    ("Cov($close, $volume, 200000)", "Cov($close, $volume, 60)"),
    ("Rsquare($close, 200000)", "Rsquare($close, 60)"),  # N > 0 keeps Qlib's std guard
    ("Ref($close, 100000000)", "Ref($close, 60)"), ("Ref($close, -100000000)", "Ref($close, -60)"),
])
def test_long_windows_of_the_other_operators(expr, same_as):
    got = _values([expr, same_as])
    assert _same(got[0], got[1]) and np.isfinite(got[0]).any() == ("Ref" not in expr)


def test_long_windows_stay_small():
    """Med(.., 200000) and WMA(.., 3000000) on 4 x 2,000 bars: windows of the block's 2,000 bars, not of
    millions (which took minutes and 11 GB before)."""
    panel = _panel(4, 2000)
    got = _values(["Med($close, 200000)", "WMA($close, 3000000)", "Mean($close, 100000000)",
                   "EMA($close, 100000000)"], panel)
    assert np.isfinite(got).mean() > 0.9
    assert lookback(parse("Mean($close, 100000000)")) == 100000000 - 1  # the plan still says what it reads


# --- deep and long expressions -------------------------------------------------------------------

@pytest.mark.parametrize("text, times", [
    ("(" * 300 + "$close" + ")" * 300, 1),
    ("+".join(["$close"] * 400), 400),
    ("+".join(["$close"] * 5000), 5000),
    ("-" * 301 + "$close", -1),
])
def test_deep_and_long_expressions_parse_and_evaluate(text, times):
    tree = parse(text)
    again = parse(text)
    assert tree == again and hash(tree) == hash(again) and parse(str(tree)) == tree
    out = _values([text])[0]
    values, first, last = _panel()
    want = values["close"].numpy().astype(np.float64) * times
    ok = np.isfinite(out)
    assert ok.any() and np.allclose(out[ok], want[ok], rtol=1e-3)


def test_four_hundred_nested_calls():
    text = "Abs(" * 200 + "Mean(" * 200 + "$close" + ", 2)" * 200 + ")" * 200
    tree = parse(text)
    assert lookback(tree) == 200 and str(tree).count("Mean(") == 200
    assert np.isfinite(_values([text])[0]).any()


# --- numbers where Qlib needs a series --------------------------------------------------------------

@pytest.mark.parametrize("expr, pos, what", [
    ("Abs(-1)", 0, "Abs's operand is a number"), ("Log(2)", 0, "Log's operand is a number"),
    ("Add(1, 2)", 0, "Add's operands are both numbers"), ("Gt(1, 2)", 0, "Gt's operands are both numbers"),
    ("$close + Sign(-3)", 9, "Sign's operand is a number"), ("Mean(1, 5)", 0, "Mean's operand is a number"),
    ("If(1, $close, 2)", 0, "If's condition is a number"), ("Corr($close, 1, 5)", 0, "second operand is a number"),
    ("Ref(2+3, 1)", 0, "Ref's operand is a number"), ("Power(2, 3)", 0, "operands are both numbers"),
])
def test_operators_on_numbers_alone_are_refused(expr, pos, what):
    with pytest.raises(InputError) as err:
        parse(expr)
    msg = str(err.value)
    assert "\n" not in msg and repr(expr) in msg and f"position {pos}:" in msg and what in msg, msg


def test_qlib_fails_where_the_parser_refuses_and_computes_where_it_accepts(tmp_path):
    """Ask Qlib itself, expression by expression: each refused case fails inside Qlib, each kept one computes."""
    refused = ["Abs(-1)", "Log(2)", "Add(1, 2)", "Gt(1, 2)", "$close + Sign(-3)", "Mean(1, 5)", "If(1, $close, 2)",
               "Corr($close, 1, 5)", "Corr(1, $close, 5)", "Power(2, 3)"]
    kept = ["Add($close, 1)", "Add(1, $close)", "If($close > 1, 1, 0)", "Greater($close, 2)", "$close + 10**30"]
    panel = make_panel(5, n_sym=2, n_bars=30)
    np.savez(tmp_path / "panel.npz", **panel)
    (tmp_path / "exprs.json").write_text(json.dumps(refused + kept))
    done = subprocess.run([str(qlib_python()), str(Path(__file__).parent / "qlib_each.py"), str(tmp_path / "panel.npz"),
                           str(tmp_path / "qlib"), str(tmp_path / "exprs.json"), str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    qlib = json.loads((tmp_path / "out.json").read_text())
    for expr in refused:
        assert qlib[expr] != "ok", expr
        with pytest.raises(InputError, match="a number|both numbers"):
            parse(expr)
    for expr in kept:
        assert qlib[expr] == "ok", (expr, qlib[expr])
        parse(expr)


def test_bitwise_operators_on_floats_are_refused():
    with pytest.raises(InputError, match=r"position 12: & between the numbers 0.5 and 1"):
        parse("$close+(0.5 & 1)")


def test_one_number_where_qlib_takes_one_is_kept():
    assert parse("Add($close, 1)") == Call("Add", (Field("close"), Const(1)))
    assert parse("If($close > 1, 1, 0)").args[1:] == (Const(1), Const(0))
    assert parse("1 + 2") == Const(3)  # Python folds it before Qlib sees it


# --- limits -----------------------------------------------------------------------------------------

def test_limits_are_one_line():
    for bad, what in [("$close+" * (MAX_EXPRESSION_CHARS // 7 + 1) + "1", "characters, more than"),
                      (f"Mean($close, {MAX_WINDOW + 1})", "must lie within"),
                      (f"Mean($close, {10 ** 400})", "must be an integer, got inf"),
                      ("Mean($close, 1e8)", "an integer")]:
        with pytest.raises(InputError, match=what) as err:
            parse(bad)
        assert "\n" not in str(err.value) and len(str(err.value)) < 600
    many = {f"F{k}": "$close" for k in range(MAX_EXPRESSIONS + 1)}
    with pytest.raises(InputError, match="more than the"):
        make_plan(None, many, None)
    with pytest.raises(InputError, match="more than the"):
        _values([f"$close+{k}" for k in range(MAX_EXPRESSIONS + 1)])


def test_cli_refuses_each_in_one_line(tmp_path):
    base = tmp_path / "base"
    from kline_store import ingest
    ingest([write_folder(tmp_path / "a", bars(3, 3, 40))], base)
    for expr, needle in [("X=Abs(-1)", "Abs's operand is a number"), ("X=" + "(" * 300 + "$close", "not closed"),
                         ("X=Mean($close, 99999999999)", "must lie within")]:
        r = run_cli("features", str(base), "-o", str(tmp_path / "g"), "--expr", expr, "--label", "none")
        assert r.returncode == 1 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr and not (tmp_path / "g").exists()
    r = run_cli("features", str(base), "-o", str(tmp_path / "ok"), "--label", "none", "--expr",
                "X=$close+9**9**9", "--expr", "Y=Med($close, 200000)", "--expr", "Z=" + "+".join(["$close"] * 400))
    assert r.returncode == 0, r.stderr


# --- fuzz: random text is a value or one line ---------------------------------------------------------

_PIECES = ["$close", "$volume", "$x", "Mean(", "Ref(", "Abs(", "Corr(", "If(", "Quantile(", "EMA(", "Med(", "Log(",
           "Power(", "(", ")", ",", "+", "-", "*", "/", "**", ">", "==", "&", "|", "0", "1", "2", "5", "0.5", "-1",
           "1e400", "9**9**9", "10**400", " ", "$", "$$a", "#", "Foo(", "1/3", "200000", "3.5"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=24) | st.text(max_size=40).map(lambda t: [t]))
def test_random_text_is_a_value_or_one_line(pieces):
    text = "".join(pieces)
    panel = _panel(2, 30)
    try:
        out = _values([text], panel)
    except KlineStoreError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and len(msg) < 1000, msg
        return
    assert out.shape == (1, 2, 30) and out.dtype == np.float32
