"""Qlib's expression syntax into a `nodes` tree.

Qlib turns '$close' into Feature("close") and 'Name(' into Operators.Name( and hands the string to Python's
eval, with Expression overloading + - * / ** > >= < <= == != & |. Precedence is therefore Python's, lowest
first: comparisons, |, &, + -, * /, unary minus, **. Two Python-isms are refused here instead of copied:
a chained comparison (Python would evaluate `a > b > c` as `(a > b) and (b > c)`, and `and` keeps only the
second Expression) and, the one extension, unary minus on an expression is accepted as 0 - x (Qlib's
Expression has no __neg__, so Qlib raises on `-$close`; on a number it is the number's sign, as in Python).
Operations between two numbers are folded as Python would fold them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kline_store.errors import InputError

from .nodes import OPS, Call, Const, Field, Node

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<field>\$\$?\w*)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>\*\*|>=|<=|==|!=|[-+*/<>&|(),]))"
)
_BINARY = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "**": "Power", ">": "Gt", ">=": "Ge", "<": "Lt",
           "<=": "Le", "==": "Eq", "!=": "Ne", "&": "And", "|": "Or"}
_FOLD = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
         "Div": lambda a, b: a / b, "Power": lambda a, b: a ** b, "Gt": lambda a, b: float(a > b),
         "Ge": lambda a, b: float(a >= b), "Lt": lambda a, b: float(a < b), "Le": lambda a, b: float(a <= b),
         "Eq": lambda a, b: float(a == b), "Ne": lambda a, b: float(a != b)}
# Binary levels from loosest to tightest binding (Python's), below unary minus and **.
_LEVELS = (("|",), ("&",), ("+", "-"), ("*", "/"))
_COMPARE = (">", ">=", "<", "<=", "==", "!=")


@dataclass(frozen=True)
class _Tok:
    kind: str  # num, field, name, op, end
    text: str
    pos: int


def _fail(expr: str, pos: int, what: str) -> InputError:
    return InputError(f"expression {expr!r}, position {pos}: {what}")


def _tokens(expr: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if m is None or m.lastgroup is None:
            at = pos + len(expr[pos:]) - len(expr[pos:].lstrip())
            raise _fail(expr, at, f"unexpected character {expr[at]!r}")
        kind, text, start = m.lastgroup, m.group(m.lastgroup), m.start(m.lastgroup)
        if kind == "field" and (text.startswith("$$") or len(text) == 1):
            what = "point-in-time fields ($$) are not supported" if text.startswith("$$") else \
                "invalid field token '$' (a field is $ followed by letters, digits or _)"
            raise _fail(expr, start, what)
        out.append(_Tok(kind, text, start))
        pos = m.end()
    out.append(_Tok("end", "", len(expr)))
    return out


class _Parser:
    def __init__(self, expr: str):
        self.expr, self.toks, self.i = expr, _tokens(expr), 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def fail(self, what: str, tok: _Tok | None = None) -> InputError:
        return _fail(self.expr, (tok or self.tok).pos, what)

    def expect(self, text: str, what: str) -> _Tok:
        if self.tok.text != text or self.tok.kind != "op":
            found = "end of expression" if self.tok.kind == "end" else repr(self.tok.text)
            raise self.fail(f"{what}, found {found}")
        return self.take()

    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise self.fail("empty expression")
        node = self.comparison()
        if self.tok.kind != "end":
            what = "unbalanced parenthesis ')'" if self.tok.text == ")" else f"unexpected {self.tok.text!r}"
            raise self.fail(f"{what} after a complete expression")
        return node

    def comparison(self) -> Node:
        left = self.level(0)
        if self.tok.kind == "op" and self.tok.text in _COMPARE:
            op = self.take()
            left = _binary(_BINARY[op.text], left, self.level(0))
            if self.tok.kind == "op" and self.tok.text in _COMPARE:
                raise self.fail("chained comparison (Python would keep only the last one); use parentheses")
        return left

    def level(self, depth: int) -> Node:
        if depth == len(_LEVELS):
            return self.unary()
        left = self.level(depth + 1)
        while self.tok.kind == "op" and self.tok.text in _LEVELS[depth]:
            op = self.take()
            left = _binary(_BINARY[op.text], left, self.level(depth + 1))
        return left

    def unary(self) -> Node:
        if self.tok.kind == "op" and self.tok.text in ("+", "-"):
            sign = self.take().text
            operand = self.unary()
            return operand if sign == "+" else _binary("Sub", Const(0), operand)
        return self.power()

    def power(self) -> Node:
        base = self.atom()
        if self.tok.kind == "op" and self.tok.text == "**":
            self.take()
            return _binary("Power", base, self.unary())  # right-associative, binds tighter than a left minus
        return base

    def atom(self) -> Node:
        tok = self.take()
        if tok.kind == "num":
            is_int = not any(c in tok.text for c in ".eE")
            return Const(int(tok.text) if is_int else float(tok.text))
        if tok.kind == "field":
            return Field(tok.text[1:].lower())  # Qlib lower-cases the field's file name
        if tok.kind == "name":
            return self.call(tok)
        if tok.text == "(":
            node = self.comparison()
            self.expect(")", f"unbalanced parenthesis: '(' at position {tok.pos} is not closed")
            return node
        found = "end of expression" if tok.kind == "end" else repr(tok.text)
        raise self.fail(f"expected a number, $field, operator call or '(', found {found}", tok)

    def call(self, name: _Tok) -> Node:
        spec = OPS.get(name.text)
        if spec is None:
            raise self.fail(f"unknown operator {name.text!r}", name)
        self.expect("(", f"operator {name.text} must be followed by '('")
        args: list[tuple[Node, _Tok]] = []
        if not (self.tok.kind == "op" and self.tok.text == ")"):
            while True:
                start = self.tok
                args.append((self.comparison(), start))
                if self.tok.kind == "op" and self.tok.text == ",":
                    self.take()
                    continue
                break
        self.expect(")", f"unbalanced parenthesis: {name.text}( at position {name.pos} is not closed")
        want = spec.n_args + len(spec.params)
        if len(args) != want:
            names = ["feature"] * spec.n_args + list(spec.params)
            raise self.fail(f"{name.text} takes {want} arguments ({', '.join(names)}), got {len(args)}", name)
        params = tuple(self.param(name.text, pname, *args[spec.n_args + k]) for k, pname in enumerate(spec.params))
        return Call(name.text, tuple(a for a, _ in args[: spec.n_args]), params)

    def param(self, op: str, pname: str, node: Node, tok: _Tok) -> float:
        if not isinstance(node, Const):
            raise self.fail(f"{op}'s {pname} must be a number, not an expression", tok)
        value, spec = node.value, OPS[op]
        if pname == "qscore":
            if not 0 <= value <= 1:
                raise self.fail(f"{op}'s qscore must lie in [0, 1], got {value!r}", tok)
            return float(value)
        kind = spec.window
        if kind == "ema" and isinstance(value, float) and 0 < value < 1:
            return value
        if not isinstance(value, int):
            raise self.fail(f"{op}'s window N must be an integer, got {value!r}", tok)
        if kind == "any":
            return value
        low = 1 if kind == "positive" else 0
        if value < low or (value != 0 and value < spec.min_window):
            need = f"an integer >= {max(low, spec.min_window)}" + (" or 0 (expanding)" if low == 0 else "")
            raise self.fail(f"{op}'s window N must be {need}, got {value}", tok)
        return value


def _binary(op: str, left: Node, right: Node) -> Node:
    if isinstance(left, Const) and isinstance(right, Const) and op in _FOLD:
        try:
            return Const(_FOLD[op](left.value, right.value))
        except ZeroDivisionError:
            return Const(float("nan"))
    if op == "Mul" and isinstance(left, Const):
        left, right = right, left  # Expression.__rmul__ returns Mul(self, other): Qlib's own operand order
    return Call(op, (left, right))


def parse(expr: str) -> Node:
    """The tree of one Qlib expression; InputError (one line: the expression, the position, what) if bad."""
    if not isinstance(expr, str):
        raise InputError(f"expression {expr!r}: not a string")
    return _Parser(expr).parse()
