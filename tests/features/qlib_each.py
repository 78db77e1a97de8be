"""Qlib's side of the refusal tests; runs in Qlib's virtualenv, never imported.

    python qlib_each.py PANEL.npz QLIB_DIR EXPRS.json OUT.json

Writes the panel as qlib_side.py does, then asks D.features for each expression on its own and records, per
expression, "ok" or the exception Qlib raised ("AttributeError: ..."): which expressions Qlib can evaluate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from qlib_side import write  # noqa: E402


def main(panel_path: str, root: str, exprs_path: str, out: str) -> None:
    import qlib
    from qlib.data import D

    panel = dict(np.load(panel_path, allow_pickle=False))
    write(panel, Path(root))
    qlib.init(provider_uri=str(root), region="cn")
    result = {}
    for expr in json.loads(Path(exprs_path).read_text()):
        try:
            D.features(D.instruments("all"), [expr], freq="day")
            result[expr] = "ok"
        except Exception as exc:  # noqa: BLE001 (what Qlib raises is the answer)
            result[expr] = f"{type(exc).__name__}: {exc}"[:300]
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
