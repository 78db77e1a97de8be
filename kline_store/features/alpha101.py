"""WorldQuant's 101 formulaic alphas (Z. Kakushadze, "101 Formulaic Alphas", 2016, arXiv:1601.00991) in the
expression language.

PAPER holds each alpha as the paper prints it; `translate` turns the paper's language into ours, one rule per
function, so that the set reads as the paper and each choice is made once (the notes say why, and where KunQuant
and the usual pandas ports choose otherwise):

    rank(x) -> CSRank(x)                       scale(x[, a]) -> CSScale(x) [* a]
    indneutralize(x, IndClass.*) -> GroupDemean(x, $INDUSTRY) (the one classification a store holds as a field)
    delay -> Ref   delta -> Delta   correlation -> Corr   covariance -> Cov   sum -> Sum   stddev -> Std (ddof 1)
    ts_min / ts_max -> Min / Max               ts_argmin / ts_argmax -> IdxMin / IdxMax (1: the window's oldest day)
    ts_rank(x, d) -> Rank(x, d): the percentile of today's value among the window's, average ties, in (0, 1]
    decay_linear(x, d) -> WMA(x, d) * Count(x, d): Qlib's WMA divides the weighted sum by the valid rows once more;
        times Count it is the paper's average with weights d, d-1, ..., 1 (the newest heaviest) summing to 1
    SignedPower(x, a) -> Sign(x) * Power(Abs(x), a)      x^y -> Power(x, y)      log / abs / sign -> Log / Abs / Sign
    product(x, 1) -> x         log(product(x, d)) -> Sum(Log(x), d) (the paper's only other product)
    min / max(x, number) -> Min / Max (the paper's ts_min / ts_max)        min / max(x, y) -> Less / Greater
    a ? b : c -> If(a, b, c)   || -> Or   && -> And   a < b -> Lt(a, b) (0 or 1, as the paper uses them)
    returns -> $close/Ref($close, 1) - 1       adv{d} -> Mean($volume, d) (shares; adv="dollar": times vwap)
    vwap -> $vwap (vwap="EXPR" for another, e.g. "$amount/$volume")      cap -> $cap
    a window d that is not an integer is floor(d), as the paper defines it

Data a store may lack: cap (alpha 56), vwap (alphas 5, 11, 25, 27, 32, 36, 41, 42, 47, 50, 57, 61, 62, 64, 65, 66,
71-75, 77, 78, 81, 83, 84, 86, 94, 96, 98; industry ones too); they read NaN without it (features says which field is
missing). The 18 alphas with indneutralize (INDUSTRY) need an industry field: alpha101(industry="FIELD").
"""

from __future__ import annotations

import math
import re

from kline_store.errors import InputError

PAPER: dict[int, str] = {
    1: "(rank(Ts_ArgMax(SignedPower(((returns < 0) ? stddev(returns, 20) : close), 2.), 5)) - 0.5)",
    2: "(-1 * correlation(rank(delta(log(volume), 2)), rank(((close - open) / open)), 6))",
    3: "(-1 * correlation(rank(open), rank(volume), 10))",
    4: "(-1 * Ts_Rank(rank(low), 9))",
    5: "(rank((open - (sum(vwap, 10) / 10))) * (-1 * abs(rank((close - vwap)))))",
    6: "(-1 * correlation(open, volume, 10))",
    7: "((adv20 < volume) ? ((-1 * ts_rank(abs(delta(close, 7)), 60)) * sign(delta(close, 7))) : (-1* 1))",
    8: "(-1 * rank(((sum(open, 5) * sum(returns, 5)) - delay((sum(open, 5) * sum(returns, 5)), 10))))",
    9: ("((0 < ts_min(delta(close, 1), 5)) ? delta(close, 1) : ((ts_max(delta(close, 1), 5) < 0) ? delta(close, 1)"
        " : (-1 * delta(close, 1))))"),
    10: ("rank(((0 < ts_min(delta(close, 1), 4)) ? delta(close, 1) : ((ts_max(delta(close, 1), 4) < 0) ? "
         "delta(close, 1) : (-1 * delta(close, 1)))))"),
    11: "((rank(ts_max((vwap - close), 3)) + rank(ts_min((vwap - close), 3))) * rank(delta(volume, 3)))",
    12: "(sign(delta(volume, 1)) * (-1 * delta(close, 1)))",
    13: "(-1 * rank(covariance(rank(close), rank(volume), 5)))",
    14: "((-1 * rank(delta(returns, 3))) * correlation(open, volume, 10))",
    15: "(-1 * sum(rank(correlation(rank(high), rank(volume), 3)), 3))",
    16: "(-1 * rank(covariance(rank(high), rank(volume), 5)))",
    17: "(((-1 * rank(ts_rank(close, 10))) * rank(delta(delta(close, 1), 1))) * rank(ts_rank((volume / adv20), 5)))",
    18: "(-1 * rank(((stddev(abs((close - open)), 5) + (close - open)) + correlation(close, open, 10))))",
    19: "((-1 * sign(((close - delay(close, 7)) + delta(close, 7)))) * (1 + rank((1 + sum(returns, 250)))))",
    20: "(((-1 * rank((open - delay(high, 1)))) * rank((open - delay(close, 1)))) * rank((open - delay(low, 1))))",
    21: ("((((sum(close, 8) / 8) + stddev(close, 8)) < (sum(close, 2) / 2)) ? (-1 * 1) : (((sum(close, 2) / 2) < "
         "((sum(close, 8) / 8) - stddev(close, 8))) ? 1 : (((1 < (volume / adv20)) || ((volume / adv20) == 1)) ? 1"
         " : (-1 * 1))))"),
    22: "(-1 * (delta(correlation(high, volume, 5), 5) * rank(stddev(close, 20))))",
    23: "(((sum(high, 20) / 20) < high) ? (-1 * delta(high, 2)) : 0)",
    24: ("((((delta((sum(close, 100) / 100), 100) / delay(close, 100)) < 0.05) || ((delta((sum(close, 100) / 100),"
         " 100) / delay(close, 100)) == 0.05)) ? (-1 * (close - ts_min(close, 100))) : (-1 * delta(close, 3)))"),
    25: "rank(((((-1 * returns) * adv20) * vwap) * (high - close)))",
    26: "(-1 * ts_max(correlation(ts_rank(volume, 5), ts_rank(high, 5), 5), 3))",
    27: "((0.5 < rank((sum(correlation(rank(volume), rank(vwap), 6), 2) / 2.0))) ? (-1 * 1) : 1)",
    28: "scale(((correlation(adv20, low, 5) + ((high + low) / 2)) - close))",
    29: ("(min(product(rank(rank(scale(log(sum(ts_min(rank(rank((-1 * rank(delta((close - 1), 5))))), 2), 1))))), "
         "1), 5) + ts_rank(delay((-1 * returns), 6), 5))"),
    30: ("(((1.0 - rank(((sign((close - delay(close, 1))) + sign((delay(close, 1) - delay(close, 2)))) + "
         "sign((delay(close, 2) - delay(close, 3)))))) * sum(volume, 5)) / sum(volume, 20))"),
    31: ("((rank(rank(rank(decay_linear((-1 * rank(rank(delta(close, 10)))), 10)))) + rank((-1 * delta(close, "
         "3)))) + sign(scale(correlation(adv20, low, 12))))"),
    32: "(scale(((sum(close, 7) / 7) - close)) + (20 * scale(correlation(vwap, delay(close, 5), 230))))",
    33: "rank((-1 * ((1 - (open / close))^1)))",
    34: "rank(((1 - rank((stddev(returns, 2) / stddev(returns, 5)))) + (1 - rank(delta(close, 1)))))",
    35: "((Ts_Rank(volume, 32) * (1 - Ts_Rank(((close + high) - low), 16))) * (1 - Ts_Rank(returns, 32)))",
    36: ("(((((2.21 * rank(correlation((close - open), delay(volume, 1), 15))) + (0.7 * rank((open - close)))) + "
         "(0.73 * rank(Ts_Rank(delay((-1 * returns), 6), 5)))) + rank(abs(correlation(vwap, adv20, 6)))) + (0.6 * "
         "rank((((sum(close, 200) / 200) - open) * (close - open)))))"),
    37: "(rank(correlation(delay((open - close), 1), close, 200)) + rank((open - close)))",
    38: "((-1 * rank(Ts_Rank(close, 10))) * rank((close / open)))",
    39: ("((-1 * rank((delta(close, 7) * (1 - rank(decay_linear((volume / adv20), 9)))))) * (1 + rank(sum(returns,"
         " 250))))"),
    40: "((-1 * rank(stddev(high, 10))) * correlation(high, volume, 10))",
    41: "(((high * low)^0.5) - vwap)",
    42: "(rank((vwap - close)) / rank((vwap + close)))",
    43: "(ts_rank((volume / adv20), 20) * ts_rank((-1 * delta(close, 7)), 8))",
    44: "(-1 * correlation(high, rank(volume), 5))",
    45: ("(-1 * ((rank((sum(delay(close, 5), 20) / 20)) * correlation(close, volume, 2)) * "
         "rank(correlation(sum(close, 5), sum(close, 20), 2))))"),
    46: ("((0.25 < (((delay(close, 20) - delay(close, 10)) / 10) - ((delay(close, 10) - close) / 10))) ? (-1 * 1) "
         ": (((((delay(close, 20) - delay(close, 10)) / 10) - ((delay(close, 10) - close) / 10)) < 0) ? 1 : ((-1 *"
         " 1) * (close - delay(close, 1)))))"),
    47: ("((((rank((1 / close)) * volume) / adv20) * ((high * rank((high - close))) / (sum(high, 5) / 5))) - "
         "rank((vwap - delay(vwap, 5))))"),
    48: ("(indneutralize(((correlation(delta(close, 1), delta(delay(close, 1), 1), 250) * delta(close, 1)) / "
         "close), IndClass.subindustry) / sum(((delta(close, 1) / delay(close, 1))^2), 250))"),
    49: ("(((((delay(close, 20) - delay(close, 10)) / 10) - ((delay(close, 10) - close) / 10)) < (-1 * 0.1)) ? 1 :"
         " ((-1 * 1) * (close - delay(close, 1))))"),
    50: "(-1 * ts_max(rank(correlation(rank(volume), rank(vwap), 5)), 5))",
    51: ("(((((delay(close, 20) - delay(close, 10)) / 10) - ((delay(close, 10) - close) / 10)) < (-1 * 0.05)) ? 1 "
         ": ((-1 * 1) * (close - delay(close, 1))))"),
    52: ("((((-1 * ts_min(low, 5)) + delay(ts_min(low, 5), 5)) * rank(((sum(returns, 240) - sum(returns, 20)) / "
         "220))) * ts_rank(volume, 5))"),
    53: "(-1 * delta((((close - low) - (high - close)) / (close - low)), 9))",
    54: "((-1 * ((low - close) * (open^5))) / ((low - high) * (close^5)))",
    55: ("(-1 * correlation(rank(((close - ts_min(low, 12)) / (ts_max(high, 12) - ts_min(low, 12)))), "
         "rank(volume), 6))"),
    56: "(0 - (1 * (rank((sum(returns, 10) / sum(sum(returns, 2), 3))) * rank((returns * cap)))))",
    57: "(0 - (1 * ((close - vwap) / decay_linear(rank(ts_argmax(close, 30)), 2))))",
    58: ("(-1 * Ts_Rank(decay_linear(correlation(IndNeutralize(vwap, IndClass.sector), volume, 3.92795), 7.89291),"
         " 5.50322))"),
    59: ("(-1 * Ts_Rank(decay_linear(correlation(IndNeutralize(((vwap * 0.728317) + (vwap * (1 - 0.728317))), "
         "IndClass.industry), volume, 4.25197), 16.2289), 8.19648))"),
    60: ("(0 - (1 * ((2 * scale(rank(((((close - low) - (high - close)) / (high - low)) * volume)))) - "
         "scale(rank(ts_argmax(close, 10))))))"),
    61: "(rank((vwap - ts_min(vwap, 16.1219))) < rank(correlation(vwap, adv180, 17.9282)))",
    62: ("((rank(correlation(vwap, sum(adv20, 22.4101), 9.91009)) < rank(((rank(open) + rank(open)) < (rank(((high"
         " + low) / 2)) + rank(high))))) * -1)"),
    63: ("((rank(decay_linear(delta(IndNeutralize(close, IndClass.industry), 2.25164), 8.22237)) - "
         "rank(decay_linear(correlation(((vwap * 0.318108) + (open * (1 - 0.318108))), sum(adv180, 37.2467), "
         "13.557), 12.2883))) * -1)"),
    64: ("((rank(correlation(sum(((open * 0.178404) + (low * (1 - 0.178404))), 12.7054), sum(adv120, 12.7054), "
         "16.6208)) < rank(delta(((((high + low) / 2) * 0.178404) + (vwap * (1 - 0.178404))), 3.69741))) * -1)"),
    65: ("((rank(correlation(((open * 0.00817205) + (vwap * (1 - 0.00817205))), sum(adv60, 8.6911), 6.40374)) < "
         "rank((open - ts_min(open, 13.635)))) * -1)"),
    66: ("((rank(decay_linear(delta(vwap, 3.51013), 7.23052)) + Ts_Rank(decay_linear(((((low * 0.96633) + (low * "
         "(1 - 0.96633))) - vwap) / (open - ((high + low) / 2))), 11.4157), 6.72611)) * -1)"),
    67: ("((rank((high - ts_min(high, 2.14593)))^rank(correlation(IndNeutralize(vwap, IndClass.sector), "
         "IndNeutralize(adv20, IndClass.subindustry), 6.02936))) * -1)"),
    68: ("((Ts_Rank(correlation(rank(high), rank(adv15), 8.91644), 13.9333) < rank(delta(((close * 0.518371) + "
         "(low * (1 - 0.518371))), 1.06157))) * -1)"),
    69: ("((rank(ts_max(delta(IndNeutralize(vwap, IndClass.industry), 2.72412), "
         "4.79344))^Ts_Rank(correlation(((close * 0.490655) + (vwap * (1 - 0.490655))), adv20, 4.92416), 9.0615)) "
         "* -1)"),
    70: ("((rank(delta(vwap, 1.29456))^Ts_Rank(correlation(IndNeutralize(close, IndClass.industry), adv50, "
         "17.8256), 17.9171)) * -1)"),
    71: ("max(Ts_Rank(decay_linear(correlation(Ts_Rank(close, 3.43976), Ts_Rank(adv180, 12.0647), 18.0175), "
         "4.20501), 15.6948), Ts_Rank(decay_linear((rank(((low + open) - (vwap + vwap)))^2), 16.4662), 4.4388))"),
    72: ("(rank(decay_linear(correlation(((high + low) / 2), adv40, 8.93345), 10.1519)) / "
         "rank(decay_linear(correlation(Ts_Rank(vwap, 3.72469), Ts_Rank(volume, 18.5188), 6.86671), 2.95011)))"),
    73: ("(max(rank(decay_linear(delta(vwap, 4.72775), 2.91864)), Ts_Rank(decay_linear(((delta(((open * 0.147155) "
         "+ (low * (1 - 0.147155))), 2.03608) / ((open * 0.147155) + (low * (1 - 0.147155)))) * -1), 3.33829), "
         "16.7411)) * -1)"),
    74: ("((rank(correlation(close, sum(adv30, 37.4843), 15.1365)) < rank(correlation(rank(((high * 0.0261661) + "
         "(vwap * (1 - 0.0261661)))), rank(volume), 11.4791))) * -1)"),
    75: "(rank(correlation(vwap, volume, 4.24304)) < rank(correlation(rank(low), rank(adv50), 12.4413)))",
    76: ("(max(rank(decay_linear(delta(vwap, 1.24383), 11.8259)), "
         "Ts_Rank(decay_linear(Ts_Rank(correlation(IndNeutralize(low, IndClass.sector), adv81, 8.14941), 19.569), "
         "17.1543), 19.383)) * -1)"),
    77: ("min(rank(decay_linear(((((high + low) / 2) + high) - (vwap + high)), 20.0451)), "
         "rank(decay_linear(correlation(((high + low) / 2), adv40, 3.1614), 5.64125)))"),
    78: ("(rank(correlation(sum(((low * 0.352233) + (vwap * (1 - 0.352233))), 19.7428), sum(adv40, 19.7428), "
         "6.83313))^rank(correlation(rank(vwap), rank(volume), 5.77492)))"),
    79: ("(rank(delta(IndNeutralize(((close * 0.60733) + (open * (1 - 0.60733))), IndClass.sector), 1.23438)) < "
         "rank(correlation(Ts_Rank(vwap, 3.60973), Ts_Rank(adv150, 9.18637), 14.6644)))"),
    80: ("((rank(Sign(delta(IndNeutralize(((open * 0.868128) + (high * (1 - 0.868128))), IndClass.industry), "
         "4.04545)))^Ts_Rank(correlation(high, adv10, 5.11456), 5.53756)) * -1)"),
    81: ("((rank(Log(product(rank((rank(correlation(vwap, sum(adv10, 49.6054), 8.47743))^4)), 14.9655))) < "
         "rank(correlation(rank(vwap), rank(volume), 5.07914))) * -1)"),
    82: ("(min(rank(decay_linear(delta(open, 1.46063), 14.8717)), "
         "Ts_Rank(decay_linear(correlation(IndNeutralize(volume, IndClass.sector), ((open * 0.634196) + (open * (1"
         " - 0.634196))), 17.4842), 6.92131), 13.4283)) * -1)"),
    83: ("((rank(delay(((high - low) / (sum(close, 5) / 5)), 2)) * rank(rank(volume))) / (((high - low) / "
         "(sum(close, 5) / 5)) / (vwap - close)))"),
    84: "SignedPower(Ts_Rank((vwap - ts_max(vwap, 15.3217)), 20.7127), delta(close, 4.96796))",
    85: ("(rank(correlation(((high * 0.876703) + (close * (1 - 0.876703))), adv30, "
         "9.61331))^rank(correlation(Ts_Rank(((high + low) / 2), 3.70596), Ts_Rank(volume, 10.1595), 7.11408)))"),
    86: ("((Ts_Rank(correlation(close, sum(adv20, 14.7444), 6.00049), 20.4195) < rank(((open + close) - (vwap + "
         "open)))) * -1)"),
    87: ("(max(rank(decay_linear(delta(((close * 0.369701) + (vwap * (1 - 0.369701))), 1.91233), 2.65461)), "
         "Ts_Rank(decay_linear(abs(correlation(IndNeutralize(adv81, IndClass.industry), close, 13.4132)), "
         "4.89768), 14.4535)) * -1)"),
    88: ("min(rank(decay_linear(((rank(open) + rank(low)) - (rank(high) + rank(close))), 8.06882)), "
         "Ts_Rank(decay_linear(correlation(Ts_Rank(close, 8.44728), Ts_Rank(adv60, 20.6966), 8.01266), 6.65053), "
         "2.61957))"),
    89: ("(Ts_Rank(decay_linear(correlation(((low * 0.967285) + (low * (1 - 0.967285))), adv10, 6.94279), "
         "5.51607), 3.79744) - Ts_Rank(decay_linear(delta(IndNeutralize(vwap, IndClass.industry), 3.48158), "
         "10.1466), 15.3012))"),
    90: ("((rank((close - ts_max(close, 4.66719)))^Ts_Rank(correlation(IndNeutralize(adv40, IndClass.subindustry),"
         " low, 5.38375), 3.21856)) * -1)"),
    91: ("((Ts_Rank(decay_linear(decay_linear(correlation(IndNeutralize(close, IndClass.industry), volume, "
         "9.74928), 16.398), 3.83219), 4.8667) - rank(decay_linear(correlation(vwap, adv30, 4.01303), 2.6809))) * "
         "-1)"),
    92: ("min(Ts_Rank(decay_linear(((((high + low) / 2) + close) < (low + open)), 14.7221), 18.8683), "
         "Ts_Rank(decay_linear(correlation(rank(low), rank(adv30), 7.58555), 6.94024), 6.80584))"),
    93: ("(Ts_Rank(decay_linear(correlation(IndNeutralize(vwap, IndClass.industry), adv81, 17.4193), 19.848), "
         "7.54455) / rank(decay_linear(delta(((close * 0.524434) + (vwap * (1 - 0.524434))), 2.77377), 16.2664)))"),
    94: ("((rank((vwap - ts_min(vwap, 11.5783)))^Ts_Rank(correlation(Ts_Rank(vwap, 19.6462), Ts_Rank(adv60, "
         "4.02992), 18.0926), 2.70756)) * -1)"),
    95: ("(rank((open - ts_min(open, 12.4105))) < Ts_Rank((rank(correlation(sum(((high + low) / 2), 19.1351), "
         "sum(adv40, 19.1351), 12.8742))^5), 11.7584))"),
    96: ("(max(Ts_Rank(decay_linear(correlation(rank(vwap), rank(volume), 3.83878), 4.16783), 8.38151), "
         "Ts_Rank(decay_linear(Ts_ArgMax(correlation(Ts_Rank(close, 7.45404), Ts_Rank(adv60, 4.13242), 3.65459), "
         "12.6556), 14.0365), 13.4143)) * -1)"),
    97: ("((rank(decay_linear(delta(IndNeutralize(((low * 0.721001) + (vwap * (1 - 0.721001))), "
         "IndClass.industry), 3.3705), 20.4523)) - Ts_Rank(decay_linear(Ts_Rank(correlation(Ts_Rank(low, 7.87871),"
         " Ts_Rank(adv60, 17.255), 4.97547), 18.5925), 15.7152), 6.71659)) * -1)"),
    98: ("(rank(decay_linear(correlation(vwap, sum(adv5, 26.4719), 4.58418), 7.18088)) - "
         "rank(decay_linear(Ts_Rank(Ts_ArgMin(correlation(rank(open), rank(adv15), 20.8187), 8.62571), 6.95668), "
         "8.07206)))"),
    99: ("((rank(correlation(sum(((high + low) / 2), 19.8975), sum(adv60, 19.8975), 8.8136)) < "
         "rank(correlation(low, volume, 6.28259))) * -1)"),
    100: ("(0 - (1 * (((1.5 * scale(indneutralize(indneutralize(rank(((((close - low) - (high - close)) / (high - "
          "low)) * volume)), IndClass.subindustry), IndClass.subindustry))) - "
          "scale(indneutralize((correlation(close, rank(adv20), 5) - rank(ts_argmin(close, 30))), "
          "IndClass.subindustry))) * (volume / adv20))))"),
    101: "((close - open) / ((high - low) + .001))",
}

INDUSTRY = frozenset(k for k, f in PAPER.items() if "indneutralize" in f.lower())

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+\.?\d*|\.\d+)|(?P<name>[A-Za-z_][\w.]*)"
                    r"|(?P<op>\|\||&&|<=|>=|==|!=|[-+*/^<>?:(),]))")
_COMPARE = {"<": "Lt", ">": "Gt", "<=": "Le", ">=": "Ge", "==": "Eq", "!=": "Ne"}
# function -> (our operator, number of expression operands before the window)
_WINDOWED = {"delay": "Ref", "delta": "Delta", "sum": "Sum", "stddev": "Std", "ts_min": "Min", "ts_max": "Max",
             "ts_argmin": "IdxMin", "ts_argmax": "IdxMax", "ts_rank": "Rank"}
_PAIRED = {"correlation": "Corr", "covariance": "Cov"}
_UNARY = {"rank": "CSRank", "log": "Log", "abs": "Abs", "sign": "Sign"}

Tree = tuple


class _Paper:
    """The paper's formula language: C-like precedence (?: loosest, then ||, &&, comparisons, + -, * /, unary
    minus, ^), function calls, numbers and names."""

    def __init__(self, text: str):
        self.text, self.toks, self.i = text, [], 0
        pos = 0
        while text[pos:].strip():
            m = _TOKEN.match(text, pos)
            if m is None:
                raise InputError(f"alpha101: cannot read {text[pos:pos + 20]!r} in {text!r}")
            self.toks.append(m.group(m.lastgroup))
            pos = m.end()
        self.toks.append("")

    def peek(self) -> str:
        return self.toks[self.i]

    def take(self, want: str | None = None) -> str:
        tok = self.toks[self.i]
        if want is not None and tok != want:
            raise InputError(f"alpha101: expected {want!r}, found {tok!r} in {self.text!r}")
        self.i += 1
        return tok

    def parse(self) -> Tree:
        tree = self.ternary()
        self.take("")
        return tree

    def ternary(self) -> Tree:
        cond = self.binary(0)
        if self.peek() != "?":
            return cond
        self.take()
        yes = self.ternary()
        self.take(":")
        return ("If", cond, yes, self.ternary())

    _LEVELS = (("||",), ("&&",), tuple(_COMPARE), ("+", "-"), ("*", "/"))

    def binary(self, depth: int) -> Tree:
        if depth == len(self._LEVELS):
            return self.unary()
        left = self.binary(depth + 1)
        while self.peek() in self._LEVELS[depth]:
            op = self.take()
            left = ("bin", op, left, self.binary(depth + 1))
        return left

    def unary(self) -> Tree:
        if self.peek() == "-":
            self.take()
            return ("neg", self.unary())
        base = self.atom()
        if self.peek() == "^":
            self.take()
            return ("bin", "^", base, self.unary())
        return base

    def atom(self) -> Tree:
        tok = self.take()
        if tok == "(":
            inner = self.ternary()
            self.take(")")
            return inner
        if re.fullmatch(r"\d+\.?\d*|\.\d+", tok):
            return ("num", tok)
        if not re.fullmatch(r"[A-Za-z_][\w.]*", tok):
            raise InputError(f"alpha101: unexpected {tok!r} in {self.text!r}")
        if self.peek() != "(":
            return ("name", tok)
        self.take("(")
        args = [self.ternary()]
        while self.peek() == ",":
            self.take()
            args.append(self.ternary())
        self.take(")")
        return ("call", tok.lower(), args)


def _window(tree: Tree, rounded: bool = False) -> int:
    if tree[0] != "num":
        raise InputError(f"alpha101: a window must be a number, got {tree!r}")
    return max(1, math.floor(float(tree[1]) + (0.5 if rounded else 0.0)))


class _Ours:
    """Trees of the paper's language as our expression text (the rules in the module's docstring)."""

    def __init__(self, industry: str | None, vwap: str, ts_rank: str = "percent", windows: str = "floor",
                 adv: str = "volume"):
        self.industry, self.vwap, self.count_rank, self.rounded = industry, vwap, ts_rank == "count", windows == "round"
        self.adv = "$volume" if adv == "volume" else f"($volume * {vwap})"

    def window(self, tree: Tree) -> int:
        return _window(tree, self.rounded)

    def __call__(self, t: Tree) -> str:
        kind = t[0]
        if kind == "num":
            return t[1] + "0" if t[1].endswith(".") else t[1]
        if kind == "name":
            return self.name(t[1])
        if kind == "neg":
            inner = self(t[1])
            return f"-{inner}" if t[1][0] == "num" else f"(0 - {inner})"
        if kind == "If":
            return f"If({self(t[1])}, {self(t[2])}, {self(t[3])})"
        if kind == "bin":
            op, a, b = t[1], self(t[2]), self(t[3])
            if op in _COMPARE:
                return f"{_COMPARE[op]}({a}, {b})"
            if op in ("||", "&&"):
                return f"{'Or' if op == '||' else 'And'}({a}, {b})"
            if op == "^":
                return f"Power({a}, {b})"
            return f"({a} {op} {b})"
        return self.call(t[1], t[2])

    def name(self, name: str) -> str:
        low = name.lower()
        if low in ("open", "high", "low", "close", "volume", "cap"):
            return f"${low}"
        if low == "vwap":
            return self.vwap
        if low == "returns":
            return "($close/Ref($close, 1) - 1)"
        m = re.fullmatch(r"adv(\d+)", low)
        if m:
            return f"Mean({self.adv}, {int(m.group(1))})"
        raise InputError(f"alpha101: unknown name {name!r}")

    def call(self, fn: str, args: list[Tree]) -> str:
        if fn in _UNARY and len(args) == 1:
            if fn == "log" and args[0][0] == "call" and args[0][1] == "product":
                inner, d = args[0][2]
                return f"Sum(Log({self(inner)}), {self.window(d)})"
            return f"{_UNARY[fn]}({self(args[0])})"
        if fn == "ts_rank" and self.count_rank:
            x, d = self(args[0]), self.window(args[1])
            return f"(Rank({x}, {d}) * Count({x}, {d}))"
        if fn in _WINDOWED:
            return f"{_WINDOWED[fn]}({self(args[0])}, {self.window(args[1])})"
        if fn in _PAIRED:
            return f"{_PAIRED[fn]}({self(args[0])}, {self(args[1])}, {self.window(args[2])})"
        if fn in ("min", "max"):
            if args[1][0] == "num":
                return f"{'Min' if fn == 'min' else 'Max'}({self(args[0])}, {self.window(args[1])})"
            return f"{'Less' if fn == 'min' else 'Greater'}({self(args[0])}, {self(args[1])})"
        if fn == "decay_linear":
            x, d = self(args[0]), self.window(args[1])
            return f"(WMA({x}, {d}) * Count({x}, {d}))"
        if fn == "scale":
            scaled = f"CSScale({self(args[0])})"
            return scaled if len(args) == 1 else f"({scaled} * {self(args[1])})"
        if fn == "signedpower":
            x = self(args[0])
            return f"(Sign({x}) * Power(Abs({x}), {self(args[1])}))"
        if fn == "product" and self.window(args[1]) == 1:
            return self(args[0])
        if fn == "indneutralize":
            if self.industry is None:
                raise InputError("alpha101: indneutralize needs an industry field (alpha101(industry=FIELD))")
            return f"GroupDemean({self(args[0])}, ${self.industry})"
        raise InputError(f"alpha101: no translation for {fn}({len(args)} arguments)")


def paper_tree(formula: str) -> Tree:
    """A formula of the paper's language as a tree of tuples: ("num", text), ("name", text), ("neg", t),
    ("If", cond, yes, no), ("bin", op, a, b), ("call", lower-case function, [args])."""
    return _Paper(formula).parse()


def translate(formula: str, industry: str | None = None, vwap: str = "$vwap", *, ts_rank: str = "percent",
              windows: str = "floor", adv: str = "volume") -> str:
    """One formula of the paper's language as an expression of ours (alpha101 says what the options do)."""
    return _Ours(industry, vwap, ts_rank, windows, adv)(paper_tree(formula))


def alpha101(industry: str | None = None, vwap: str = "$vwap", *, ts_rank: str = "percent",
             windows: str = "floor", adv: str = "volume") -> dict[str, str]:
    """ALPHA001 .. ALPHA101 -> expression.

    Args:
        industry: a field of industry codes (e.g. "industry"); without it the INDUSTRY alphas are left out.
        vwap: the expression read as vwap (e.g. "$amount/$volume" for a store with amounts and no vwap).
        ts_rank: "percent" (ours: the percentile in (0, 1], as the paper compares ts_rank with rank and takes
            1 - ts_rank) or "count" (1 .. d, KunQuant's and the pandas ports').
        windows: "floor" (the paper's rule for a non-integer d) or "round" (KunQuant's).
        adv: "volume" (adv{d} the mean share volume, as KunQuant and the pandas ports) or "dollar" (the paper's
            words, average daily dollar volume: the mean of volume * vwap).
    """
    if industry is not None and not re.fullmatch(r"\w+", industry):
        raise InputError(f"alpha101: industry={industry!r} is not a field name (letters, digits, _)")
    if ts_rank not in ("percent", "count") or windows not in ("floor", "round") or adv not in ("volume", "dollar"):
        raise InputError(f"alpha101: ts_rank must be 'percent' or 'count', windows 'floor' or 'round' and adv "
                         f"'volume' or 'dollar', got {ts_rank!r}, {windows!r} and {adv!r}")
    return {f"ALPHA{k:03d}": translate(f, industry, vwap, ts_rank=ts_rank, windows=windows, adv=adv)
            for k, f in PAPER.items() if industry is not None or k not in INDUSTRY}
