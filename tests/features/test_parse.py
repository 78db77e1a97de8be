"""The parser: Qlib's own reading of expressions (str of Qlib's Expression tree), errors, shared nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kline_store.errors import InputError
from kline_store.features.nodes import OPS, Call, Const, Field
from kline_store.features.parse import parse
from kline_store.features.sets import alpha158, alpha360, label

sys.path.insert(0, str(Path(__file__).parent))
from qlib_run import qlib_python  # noqa: E402
from test_ops import EXPRS  # noqa: E402

PRECEDENCE = [
    "$a+$b*$c", "$a-$b-$c", "$a/$b/$c", "$a*$b+$c/$d", "($a+$b)*$c", "$a > $b + 1", "$a > $b & $c",
    "$a | $b & $c", "$a == $b | $c", "$a**2*3", "2**$a", "$a**-1", "2*$close", "1-$a", "-2+$a", "$a*-3",
    "$a != Ref($a, 1)", "If($a>$b, $a, -1)", "Greater($a, 0)-Less($b, 1e-12)", "Mean($close, 5)/ $close",
]


def test_parse_reads_expressions_as_qlib_does(tmp_path):
    exprs = PRECEDENCE + EXPRS + list(alpha158().values()) + list(alpha360().values()) + list(label().values())
    (tmp_path / "in.json").write_text(json.dumps(exprs))
    done = subprocess.run([str(qlib_python()), str(Path(__file__).parent / "qlib_exprs.py"), str(tmp_path / "in.json"),
                           str(tmp_path / "out.json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads((tmp_path / "out.json").read_text())["str"]
    differ = [(e, str(parse(e)), q) for e, q in zip(exprs, theirs) if str(parse(e)) != q]
    assert not differ, differ[:5]


@pytest.mark.parametrize("expr, pos, what", [
    ("Mean($close, 5", 14, "unbalanced parenthesis"),
    ("($close + 1", 11, "unbalanced parenthesis"),
    ("$close + 1)", 10, "unbalanced parenthesis ')'"),
    ("Foo($close)", 0, "unknown operator 'Foo'"),
    ("$close + $", 9, "invalid field token"),
    ("$$roe_q", 0, "point-in-time"),
    ("Mean($close)", 0, "Mean takes 2 arguments"),
    ("Ref($close, 1, 2)", 0, "Ref takes 2 arguments"),
    ("Mean($close, 2.5)", 13, "must be an integer"),
    ("Mean($close, -5)", 13, "must be an integer >= 1 or 0"),
    ("Std($close, $open)", 12, "must be a number, not an expression"),
    ("Skew($close, 2)", 13, "integer >= 3"),
    ("Corr($close, $open, 0)", 20, "integer >= 1"),
    ("Quantile($close, 5, 1.5)", 20, "qscore"),
    ("EMA($close, 1.5)", 12, "must be an integer"),
    ("$close $open", 7, "unexpected '$open'"),
    ("$close > $open > $low", 15, "chained comparison"),
    ("$close # 2", 7, "unexpected character '#'"),
    ("", 0, "empty expression"),
    ("Mean($close, 5) +", 17, "expected a number"),
    ("close", 0, "unknown operator 'close'"),
])
def test_bad_expressions_name_the_expression_and_position(expr, pos, what):
    with pytest.raises(InputError) as err:
        parse(expr)
    msg = str(err.value)
    assert "\n" not in msg and repr(expr) in msg and f"position {pos}:" in msg and what in msg, msg


def test_windows_and_signs():
    assert parse("Ref($close, -2)") == Call("Ref", (Field("close"),), (-2,))
    assert parse("Mean($close, 0)").params == (0,)
    assert parse("EMA($close, 0.5)").params == (0.5,)
    assert parse("-$close") == Call("Sub", (Const(0), Field("close")))
    assert parse("-2**2") == Const(-4) and parse("$CLOSE") == Field("close")


def test_equal_subexpressions_are_one_key():
    tree = parse("Mean($close, 5)/$close + Mean($close,5)")
    left, right = tree.args
    assert left.args[0] == right and hash(left.args[0]) == hash(right)
    assert len({parse("Std($close, 5)"), parse("Std( $close ,5 )")}) == 1


_leaf = st.one_of(st.sampled_from(["close", "open", "volume", "x1"]).map(Field),
                  st.integers(0, 50).map(Const), st.floats(0.001, 100, allow_nan=False).map(Const))


def _call(children):
    """Operators on operands Qlib accepts: a series where it loads one (Ref(0, 1) and Add(1, 2) are refused)."""
    elem = st.sampled_from([k for k, v in OPS.items() if v.n_args == 2 and not v.params])
    roll = st.sampled_from([k for k, v in OPS.items() if v.window == "expanding" and len(v.params) == 1])
    series = children.filter(lambda c: not isinstance(c, Const))
    return st.one_of(
        st.builds(lambda op, a, b: Call(op, (a, b)), elem, series, children),
        st.builds(lambda op, a, b: Call(op, (a, b)), elem, children, series),
        st.builds(lambda op, a, n: Call(op, (a,), (n,)), roll, series, st.integers(5, 30)),
        st.builds(lambda a, n: Call("Ref", (a,), (n,)), series, st.integers(-5, 5)),
        st.builds(lambda a, q: Call("Quantile", (a,), (10, q)), series, st.sampled_from([0.2, 0.5, 0.8])),
    )


@settings(max_examples=200, deadline=None)
@given(st.recursive(_leaf, _call, max_leaves=8))
def test_printed_trees_parse_back(tree):
    assert parse(str(tree)) == tree
