"""The paper's Alpha101 formulas evaluated by pandas, as a reader of the paper would write its functions: frames
of [dates, symbols], full windows (min_periods = the window), pandas' own rank, rolling and shift. An independent
transcription of the semantics to check kline_store.features.alpha101 against (the formulas are read by its parser,
alpha101.paper_tree, and evaluated here)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kline_store.features.alpha101 import PAPER, paper_tree


def _d(tree) -> int:
    return max(1, math.floor(float(tree[1])))


def _decay(x: pd.DataFrame, d: int) -> pd.DataFrame:
    w = np.arange(1, d + 1, dtype=np.float64)
    return x.rolling(d).apply(lambda v: (v * w).sum() / w.sum(), raw=True)


def _arg(x: pd.DataFrame, d: int, fn) -> pd.DataFrame:
    return x.rolling(d).apply(lambda v: fn(v) + 1, raw=True)


class PandasAlpha:
    """data: field -> [dates, symbols] frame (open, high, low, close, volume, vwap, and industry if needed)."""

    def __init__(self, data: dict[str, pd.DataFrame]):
        self.data = data

    def __call__(self, number: int) -> pd.DataFrame:
        with np.errstate(all="ignore"):
            out = self.eval(paper_tree(PAPER[number]))
        if not isinstance(out, pd.DataFrame):
            out = pd.DataFrame(out, index=self.data["close"].index, columns=self.data["close"].columns)
        return out.astype(np.float64)

    def eval(self, t):
        kind = t[0]
        if kind == "num":
            return float(t[1])
        if kind == "name":
            return self.name(t[1].lower())
        if kind == "neg":
            return -self.eval(t[1])
        if kind == "If":
            cond, yes, no = (self.eval(a) for a in t[1:])
            like = self.data["close"]
            yes = yes if isinstance(yes, pd.DataFrame) else pd.DataFrame(yes, like.index, like.columns)
            return yes.where(cond.astype(bool), no)
        if kind == "bin":
            op, a, b = t[1], self.eval(t[2]), self.eval(t[3])
            ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
                   "^": lambda: a ** b, "<": lambda: (a < b) * 1.0, ">": lambda: (a > b) * 1.0,
                   "<=": lambda: (a <= b) * 1.0, ">=": lambda: (a >= b) * 1.0, "==": lambda: (a == b) * 1.0,
                   "||": lambda: ((a != 0) | (b != 0)) * 1.0, "&&": lambda: ((a != 0) & (b != 0)) * 1.0}
            return ops[op]()
        return self.call(t[1], t[2])

    def name(self, name: str):
        if name == "returns":
            close = self.data["close"]
            return close / close.shift(1) - 1
        if name.startswith("adv"):
            return self.data["volume"].rolling(int(name[3:])).mean()
        return self.data[name]

    def call(self, fn: str, args):
        x = self.eval(args[0])
        if fn == "rank":
            return x.rank(axis=1, pct=True)
        if fn in ("log", "abs", "sign"):
            return getattr(np, fn)(x)
        if fn == "scale":
            return x.div(x.abs().sum(axis=1), axis=0) * (self.eval(args[1]) if len(args) > 1 else 1.0)
        if fn == "signedpower":
            return np.sign(x) * np.abs(x) ** self.eval(args[1])
        if fn == "indneutralize":
            ind = self.data["industry"]
            stacked = pd.DataFrame({"x": x.stack(future_stack=True), "g": ind.stack(future_stack=True)})
            mean = stacked.groupby([stacked.index.get_level_values(0), stacked.g])["x"].transform("mean")
            return (stacked.x - mean).unstack()
        if fn in ("correlation", "covariance"):
            y, d = self.eval(args[1]), _d(args[2])
            roll = x.rolling(d)
            return roll.corr(y) if fn == "correlation" else roll.cov(y)
        if fn in ("min", "max") and args[1][0] != "num":
            y = self.eval(args[1])
            return np.minimum(x, y) if fn == "min" else np.maximum(x, y)
        d = _d(args[1])
        if fn == "delay":
            return x.shift(d)
        if fn == "delta":
            return x - x.shift(d)
        simple = {"sum": "sum", "stddev": "std", "ts_min": "min", "ts_max": "max", "min": "min", "max": "max"}
        if fn in simple:
            return getattr(x.rolling(d), simple[fn])()
        if fn == "ts_rank":
            return x.rolling(d).rank(pct=True)
        if fn == "ts_argmax":
            return _arg(x, d, np.argmax)
        if fn == "ts_argmin":
            return _arg(x, d, np.argmin)
        if fn == "decay_linear":
            return _decay(x, d)
        if fn == "product":
            return x.rolling(d).apply(np.prod, raw=True)
        raise ValueError(f"no pandas transcription of {fn}")
