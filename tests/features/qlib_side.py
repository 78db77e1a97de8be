"""Qlib's side of the feature-engine tests; runs in Qlib's own virtualenv (.venv-qlib), never imported.

    python qlib_side.py PANEL.npz QLIB_DIR EXPRS.json OUT.npz

PANEL.npz holds dates [T] ('YYYY-MM-DD'), symbols [S] (Qlib instrument names), fields [F], values [F, S, T]
float32 and first/last [S] (inclusive bar index of each symbol's span). The provider directory is written
with Qlib's own storage classes, each symbol's span in one piece (NaN rows stay NaN rows, as Qlib pads a
suspension); instruments/all.txt is written by hand, one 'name<TAB>start<TAB>end' line per symbol (Qlib's
FileInstrumentStorage writes its columns in an order its own reader misreads). Then D.features computes every
expression in EXPRS.json for all instruments, and OUT.npz holds values [E, S, T] float32 on the panel's grid
(NaN where Qlib has no row), returned [S, T] (the rows Qlib returned) and seconds (D.features' wall time).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def write(panel: dict, out: Path) -> None:
    import qlib
    from qlib.data.storage.file_storage import FileCalendarStorage, FileFeatureStorage

    for sub in ("calendars", "instruments", "features"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    uri = {"day": str(out)}
    qlib.init(provider_uri=str(out), region="cn")
    dates = [str(d) for d in panel["dates"]]
    FileCalendarStorage(freq="day", future=False, provider_uri=uri).extend(dates)
    lines = []
    for s, name in enumerate(panel["symbols"]):
        lo, hi = int(panel["first"][s]), int(panel["last"][s])
        (out / "features" / name.lower()).mkdir(exist_ok=True)
        for f, field in enumerate(panel["fields"]):
            FileFeatureStorage(name, str(field), "day", provider_uri=uri).write(
                panel["values"][f, s, lo: hi + 1].astype(np.float32), index=lo)
        lines.append(f"{name}\t{dates[lo]}\t{dates[hi]}\n")
    (out / "instruments" / "all.txt").write_text("".join(lines))


def features(root: Path, panel: dict, exprs: list[str]) -> dict:
    import qlib
    from qlib.data import D

    qlib.init(provider_uri=str(root), region="cn")
    started = time.perf_counter()
    df = D.features(D.instruments("all"), exprs, freq="day")
    seconds = time.perf_counter() - started
    sym = {str(n): i for i, n in enumerate(panel["symbols"])}
    day = {np.datetime64(str(d), "D"): i for i, d in enumerate(panel["dates"])}
    rows = np.array([sym[i] for i in df.index.get_level_values(0)])
    cols = np.array([day[d] for d in df.index.get_level_values(1).to_numpy().astype("datetime64[D]")])
    n_sym, n_bars = len(panel["symbols"]), len(panel["dates"])
    values = np.full((len(exprs), n_sym, n_bars), np.nan, dtype=np.float32)
    values[:, rows, cols] = df[exprs].to_numpy(dtype=np.float32).T
    returned = np.zeros((n_sym, n_bars), dtype=bool)
    returned[rows, cols] = True
    return {"values": values, "returned": returned, "seconds": np.float64(seconds)}


def main(panel_path: str, root: str, exprs_path: str, out: str) -> None:
    panel = dict(np.load(panel_path, allow_pickle=False))
    exprs = json.loads(Path(exprs_path).read_text())
    write(panel, Path(root))
    np.savez(out, **features(Path(root), panel, exprs))


if __name__ == "__main__":
    main(*sys.argv[1:])
