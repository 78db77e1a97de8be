"""Qlib's expression syntax into a `nodes` tree.

Qlib turns '$close' into Feature("close") and 'Name(' into Operators.Name( and hands the string to Python's
eval, with Expression overloading + - * / ** > >= < <= == != & |. Precedence is therefore Python's, lowest
first: comparisons, |, &, + -, * /, unary minus, **. Two Python-isms are refused here instead of copied:
a chained comparison (Python would evaluate `a > b > c` as `(a > b) and (b > c)`, and `and` keeps only the
second Expression) and, the one extension, unary minus on an expression is accepted as 0 - x (Qlib's
Expression has no __neg__, so Qlib raises on `-$close`; on a number it is the number's sign, as in Python).
Operations between two numbers are folded as Python would fold them, within float range (fold.py).

Expressions are untrusted text: the parser is a loop over an explicit stack (no recursion, so 300 nested
parentheses or a sum of 10,000 terms cost memory, not Python's stack), the text has a length limit, windows a
size limit, and operators applied to numbers alone (Abs(-1), Add(1, 2)), which Qlib fails on, are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kline_store.errors import InputError

from .fold import FOLDABLE, fold, number
from .nodes import OPS, Call, Const, Field, Node

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<field>\$\$?\w*)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>\*\*|>=|<=|==|!=|[-+*/<>&|(),]))"
)
_SPACE = re.compile(r"\s*")
_BINARY = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "**": "Power", ">": "Gt", ">=": "Ge", "<": "Lt",
           "<=": "Le", "==": "Eq", "!=": "Ne", "&": "And", "|": "Or"}
_COMPARE = (">", ">=", "<", "<=", "==", "!=")
# Largest window N accepted; any window longer than the series reads all of it (windows are clamped to the
# block when evaluated), so larger ones only ever mean 'the whole series'.
MAX_WINDOW = 2 ** 31 - 1
# Longest expression text accepted (Alpha158's longest is under 100 characters).
MAX_EXPRESSION_CHARS = 65536


@dataclass(frozen=True)
class _Tok:
    kind: str  # num, field, name, op, end
    text: str
    pos: int


def _short(text: str, keep: int = 200) -> str:
    """text, or its start and end around an ellipsis: a message stays one readable line."""
    return text if len(text) <= keep else f"{text[: keep // 2]}...{text[-keep // 2:]}"


def _fail(expr: str, pos: int, what: str) -> InputError:
    return InputError(f"expression {_short(repr(expr))}, position {pos}: {what}")


def _tokens(expr: str) -> list[_Tok]:
    out, pos = [], 0
    while True:
        pos = _SPACE.match(expr, pos).end()
        if pos == len(expr):
            break
        m = _TOKEN.match(expr, pos)
        if m is None or m.lastgroup is None:
            raise _fail(expr, pos, f"unexpected character {expr[pos]!r}")
        kind, text, start = m.lastgroup, m.group(m.lastgroup), m.start(m.lastgroup)
        if kind == "field" and (text.startswith("$$") or len(text) == 1):
            what = "point-in-time fields ($$) are not supported" if text.startswith("$$") else \
                "invalid field token '$' (a field is $ followed by letters, digits or _)"
            raise _fail(expr, start, what)
        out.append(_Tok(kind, text, start))
        pos = m.end()
    out.append(_Tok("end", "", len(expr)))
    return out


# Binding strength of each binary operator (Python's, loosest first); unary +/- sits between * / and **.
_PREC = {**{c: 1 for c in _COMPARE}, "|": 2, "&": 3, "+": 4, "-": 4, "*": 5, "/": 5, "**": 7}
_UNARY = 6


@dataclass
class _Frame:
    """One nesting level: the whole expression, a '(' or an operator call's argument list. Each holds its own
    operand and operator stacks, so that depth costs list entries, never Python stack frames."""

    kind: str  # top, paren, call
    open: _Tok  # the '(' or the operator's name
    values: list = field(default_factory=list)
    ops: list = field(default_factory=list)  # (text, precedence, token); unary ops as ('u+' / 'u-', ...)
    args: list = field(default_factory=list)  # a call's finished (node, first token) arguments
    arg_start: _Tok | None = None
    compared: bool = False


class _Parser:
    """Operator precedence (shunting-yard) over an explicit stack of frames: 300 nested parentheses or a sum
    of thousands of terms parse in a loop, with no recursion."""

    def __init__(self, expr: str):
        self.expr, self.toks = expr, _tokens(expr)

    def fail(self, tok: _Tok, what: str) -> InputError:
        return _fail(self.expr, tok.pos, what)

    @staticmethod
    def _found(tok: _Tok) -> str:
        return "end of expression" if tok.kind == "end" else repr(tok.text)

    def _reduce(self, frame: _Frame, prec: int = 0, right: bool = False) -> None:
        """Apply the frame's pending operators that bind at least as tightly as an incoming one of `prec`."""
        while frame.ops:
            text, p, tok = frame.ops[-1]
            if p < prec or (p == prec and right):
                return
            frame.ops.pop()
            if text in ("u+", "u-"):
                operand = frame.values.pop()
                frame.values.append(operand if text == "u+" else _binary("Sub", Const(0), operand))
            else:
                rhs = frame.values.pop()
                try:
                    frame.values.append(_binary(_BINARY[text], frame.values.pop(), rhs))
                except ValueError as exc:  # no number for two numbers (fold.py says why)
                    raise self.fail(tok, str(exc)) from None

    def _finish(self, frame: _Frame) -> Node:
        self._reduce(frame)
        return frame.values.pop()

    def _unclosed(self, frame: _Frame, tok: _Tok) -> InputError:
        opened = f"'(' at position {frame.open.pos}" if frame.kind == "paren" else \
            f"{frame.open.text}( at position {frame.open.pos}"
        return self.fail(tok, f"unbalanced parenthesis: {opened} is not closed, found {self._found(tok)}")

    def parse(self) -> Node:
        toks = self.toks
        if toks[0].kind == "end":
            raise self.fail(toks[0], "empty expression")
        frames = [_Frame("top", toks[0])]
        i, want_operand = 0, True
        while True:
            tok, frame = toks[i], frames[-1]
            i += 1
            if want_operand:
                if tok.kind == "num":
                    frame.values.append(Const(number(tok.text)))
                    want_operand = False
                elif tok.kind == "field":
                    frame.values.append(Field(tok.text[1:].lower()))  # Qlib lower-cases the field's file name
                    want_operand = False
                elif tok.kind == "name":
                    if tok.text not in OPS:
                        raise self.fail(tok, f"unknown operator {tok.text!r}")
                    paren = toks[i]
                    if paren.kind != "op" or paren.text != "(":
                        raise self.fail(paren, f"operator {tok.text} must be followed by '(', found "
                                        f"{self._found(paren)}")
                    i += 1
                    frames.append(_Frame("call", tok, arg_start=toks[i]))
                    if toks[i].kind == "op" and toks[i].text == ")":  # no arguments at all
                        i += 1
                        frames.pop()
                        frames[-1].values.append(self._call(tok, []))
                        want_operand = False
                elif tok.kind == "op" and tok.text == "(":
                    frames.append(_Frame("paren", tok))
                elif tok.kind == "op" and tok.text in ("+", "-"):
                    frame.ops.append(("u" + tok.text, _UNARY, tok))
                else:
                    raise self.fail(tok, f"expected a number, $field, operator call or '(', found {self._found(tok)}")
                continue
            if tok.kind == "op" and tok.text in _PREC:
                prec = _PREC[tok.text]
                if prec == 1:
                    if frame.compared:
                        raise self.fail(tok, "chained comparison (Python would keep only the last one); use "
                                        "parentheses")
                    frame.compared = True
                self._reduce(frame, prec, right=tok.text == "**")
                frame.ops.append((tok.text, prec, tok))
                want_operand = True
            elif frame.kind == "top":
                if tok.kind == "end":
                    return self._finish(frame)
                what = "unbalanced parenthesis ')'" if tok.text == ")" else f"unexpected {tok.text!r}"
                raise self.fail(tok, f"{what} after a complete expression")
            elif tok.kind == "op" and tok.text == ")":
                frames.pop()
                if frame.kind == "paren":
                    frames[-1].values.append(self._finish(frame))
                else:
                    frame.args.append((self._finish(frame), frame.arg_start))
                    frames[-1].values.append(self._call(frame.open, frame.args))
            elif frame.kind == "call" and tok.kind == "op" and tok.text == ",":
                frame.args.append((self._finish(frame), frame.arg_start))
                frame.compared, frame.arg_start, want_operand = False, toks[i], True
            else:
                raise self._unclosed(frame, tok)

    def _call(self, name: _Tok, args: list[tuple[Node, _Tok]]) -> Node:
        spec = OPS[name.text]
        want = spec.n_args + len(spec.params)
        if len(args) != want:
            names = ["feature"] * spec.n_args + list(spec.params)
            raise self.fail(name, f"{name.text} takes {want} arguments ({', '.join(names)}), got {len(args)}")
        operands = tuple(a for a, _ in args[: spec.n_args])
        which = _numbers_refused(name.text, operands)
        if which:
            raise self.fail(name, f"{name.text}'s {which}; Qlib cannot evaluate that either (an "
                            "operand must be a $field or an operator call)")
        params = tuple(self.param(name.text, pname, *args[spec.n_args + k]) for k, pname in enumerate(spec.params))
        return Call(name.text, operands, params)

    def param(self, op: str, pname: str, node: Node, tok: _Tok) -> float:
        if not isinstance(node, Const):
            raise self.fail(tok, f"{op}'s {pname} must be a number, not an expression")
        value, spec = node.value, OPS[op]
        if pname == "qscore":
            if not 0 <= value <= 1:
                raise self.fail(tok, f"{op}'s qscore must lie in [0, 1], got {value!r}")
            return float(value)
        kind = spec.window
        if kind == "ema" and isinstance(value, float) and 0 < value < 1:
            return value
        if not isinstance(value, int):
            raise self.fail(tok, f"{op}'s window N must be an integer, got {value!r}")
        if abs(value) > MAX_WINDOW:
            raise self.fail(tok, f"{op}'s window N must lie within +-{MAX_WINDOW} (a window longer than the "
                            f"series reads all of it), got {_short(str(value), 40)}")
        if kind == "any":
            return value
        low = 1 if kind == "positive" else 0
        if value < low or (value != 0 and value < spec.min_window):
            need = f"an integer >= {max(low, spec.min_window)}" + (" or 0 (expanding)" if low == 0 else "")
            raise self.fail(tok, f"{op}'s window N must be {need}, got {value}")
        return value


def _numbers_refused(op: str, operands: tuple[Node, ...]) -> str:
    """Which operands are numbers where Qlib needs an expression ('' if none): Qlib calls `.load` on them
    (AttributeError on a number). One number in an element-wise pair is fine (Add($close, 1)), two are not
    (Qlib computes the number, then fails on its `.name`); If takes numbers for its branches, not for its
    condition; Corr and Cov need two series; every other operator its one operand."""
    number = [isinstance(a, Const) for a in operands]
    if op in ("Corr", "Cov"):
        return "operands are both numbers" if all(number) else \
            f"{'first' if number[0] else 'second'} operand is a number" if any(number) else ""
    if op == "If":
        return "condition is a number" if number[0] else ""
    if len(operands) == 1:
        return "operand is a number" if number[0] else ""
    return "operands are both numbers" if all(number) else ""


def _binary(op: str, left: Node, right: Node) -> Node:
    if isinstance(left, Const) and isinstance(right, Const) and op in FOLDABLE:
        return Const(fold(op, left.value, right.value))
    if op == "Mul" and isinstance(left, Const):
        left, right = right, left  # Expression.__rmul__ returns Mul(self, other): Qlib's own operand order
    return Call(op, (left, right))


def parse(expr: str) -> Node:
    """The tree of one Qlib expression; InputError (one line: the expression, the position, what) if bad."""
    if not isinstance(expr, str):
        raise InputError(f"expression {_short(repr(expr))}: not a string")
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise InputError(f"expression {_short(repr(expr))}: {len(expr):,} characters, more than the "
                         f"{MAX_EXPRESSION_CHARS:,} an expression may have")
    return _Parser(expr).parse()
