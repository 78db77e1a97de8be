"""Operations between two numbers of an expression, folded as Python folds them, but within float range.

Qlib hands the expression text to Python's eval, so `2**3` or `1/4` reach it as numbers. Python's own rules
are not safe on untrusted text: `9**9**9` computes an integer of 370 million digits (minutes), `10**400` is an
integer no float holds (OverflowError when it meets a series), `(-8)**(1/3)` is a complex number (which torch
would cast to its real part). Here an integer result is kept while a float64 can hold it, and anything else is
computed as numpy's float64 does: out of range is +-inf, a negative base to a fractional power is NaN, and
division by zero (which Python refuses) is NaN, as it always was here.
"""

from __future__ import annotations

import math
import operator
import sys
import warnings

import numpy as np

# Integers beyond the largest float64 fold to +-inf, as numpy's float64 would (so every kept integer converts).
_FLOAT_MAX = int(sys.float_info.max)
# Digits of an integer literal read as an exact integer; longer ones are read as a float (+inf), never
# handed to int() (Python refuses over 4300 digits, and the number could not be a float anyway).
MAX_INT_DIGITS = 309

_COMPARE = {"Gt": operator.gt, "Ge": operator.ge, "Lt": operator.lt, "Le": operator.le, "Eq": operator.eq,
            "Ne": operator.ne}
_ARITH = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "Div": operator.truediv}
_NUMPY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
FOLDABLE = frozenset(_COMPARE) | frozenset(_ARITH) | {"Power", "And", "Or"}


def _bounded(value: int | float) -> int | float:
    """value as a number a float64 can hold: an integer past float range becomes +-inf."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int) and abs(value) > _FLOAT_MAX:
        return math.copysign(math.inf, value)
    return value


def _numpy(fn, a: int | float, b: int | float) -> float:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(fn(np.float64(a), np.float64(b)))


def _power(a: int | float, b: int | float) -> int | float:
    if isinstance(a, int) and isinstance(b, int) and b >= 0:
        if abs(a) <= 1:
            return a ** (b % 2 + 2 if b > 2 else b)  # 0, 1 or -1 to a huge power: its parity decides
        if b * math.log2(abs(a)) < 1100:  # the exact integer is small enough to compute (and maybe a float)
            return _bounded(a ** b)
        return -math.inf if a < 0 and b % 2 else math.inf
    return _numpy(np.power, a, b)  # floats, negative powers: numpy's real power (NaN, never complex)


def fold(op: str, a: int | float, b: int | float) -> int | float:
    """op (one of FOLDABLE) on two numbers: Python's result where it is a float64 number, numpy's otherwise.
    ValueError (a sentence) where Python has no number to give."""
    if op == "Power":
        return _power(a, b)
    if op in _COMPARE:
        return float(_COMPARE[op](a, b))
    if op in ("And", "Or"):  # Python's bitwise & and | of two integers; of floats a TypeError in Qlib too
        if not (isinstance(a, int) and isinstance(b, int)):
            raise ValueError(f"{'&' if op == 'And' else '|'} between the numbers {a!r} and {b!r} (Python's "
                             "bitwise operators take integers)")
        return a & b if op == "And" else a | b
    if op == "Div" and b == 0:
        return math.nan
    try:
        return _bounded(_ARITH[op](a, b))
    except OverflowError:  # float arithmetic past float range (Python raises where numpy gives +-inf)
        return _numpy(_NUMPY[op], a, b)


def number(text: str) -> int | float:
    """A numeric literal: an integer when it is written as one and fits a float64, else a float."""
    if any(c in text for c in ".eE") or len(text) > MAX_INT_DIGITS:
        return float(text)  # a too long literal reads as inf, as float() reads it
    return _bounded(int(text))
