"""Qlib's side of the parser and feature-set tests; runs in Qlib's virtualenv, never imported.

    python qlib_exprs.py IN.json OUT.json

IN.json: a list of expressions. OUT.json: {"str": [str(Qlib's Expression) for each], "alpha158": [names,
fields], "alpha360": [names, fields], "label": [fields, names]} from Qlib's own loader and handler.
"""

import json
import sys


def main(src: str, dst: str) -> None:
    from qlib.contrib.data.handler import Alpha158
    from qlib.contrib.data.loader import Alpha158DL, Alpha360DL
    from qlib.data.base import Feature  # noqa: F401  (names the parsed string refers to)
    from qlib.data.ops import Operators, register_all_ops
    from qlib.config import C
    from qlib.utils import parse_field

    register_all_ops(C)
    exprs = json.load(open(src))
    out = {
        "str": [str(eval(parse_field(e), {"Feature": Feature, "Operators": Operators})) for e in exprs],
        "alpha158": list(Alpha158DL.get_feature_config()[::-1]),
        "alpha360": list(Alpha360DL.get_feature_config()[::-1]),
        "label": list(Alpha158.get_label_config(None)),
    }
    json.dump(out, open(dst, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:])
