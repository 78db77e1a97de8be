"""Qlib's side of tests/features/test_processors.py: run in Qlib's virtualenv, never imported by the tests.

    python helpers_qlib_processors.py SPECS.json

Imports Qlib once, then serves requests, one a line on stdin: `IN.npz OUT.npz`. IN holds a panel (x[dates,
symbols, columns] float32, present[dates, symbols], n_feat, fit_lo, fit_hi); it becomes a frame shaped as Qlib's
handlers produce theirs (index (datetime, instrument) of the present rows, columns ('feature', F<i>) then ('label',
LABEL<j>)), and every spec runs on a copy of it with Qlib's own classes: a processor (fit, then call) or a
DataHandlerLP over a StaticDataLoader. OUT gets, per output, `<name>.x` (NaN where Qlib has no row) and
`<name>.kept` (the rows Qlib kept). Each request is answered by one line: `ok`, or `error <json traceback>`.
"""

from __future__ import annotations

import inspect
import json
import sys
import traceback
import warnings

import numpy as np
import pandas as pd
from qlib.data.dataset import processor as qp
from qlib.data.dataset.handler import DataHandlerLP
from qlib.data.dataset.loader import StaticDataLoader

warnings.simplefilter("ignore")  # Qlib's nanmean of an all-NaN column warns, as it should; the answer is NaN


def frame(x: np.ndarray, present: np.ndarray, n_feat: int) -> tuple[pd.DataFrame, pd.DatetimeIndex, pd.Index]:
    """The panel as Qlib's handler frame, with the date and instrument axes to map rows back."""
    d, s, c = x.shape
    dates = pd.bdate_range("2020-01-22", periods=d)  # crosses a month end: ProcessInf works month by month
    syms = pd.Index([f"SH{600000 + i}" for i in range(s)])
    index = pd.MultiIndex.from_product([dates, syms], names=["datetime", "instrument"])
    cols = pd.MultiIndex.from_tuples([("feature", f"F{i}") for i in range(n_feat)]
                                     + [("label", f"LABEL{j}") for j in range(c - n_feat)])
    # float64 holding the float32 values exactly: pandas then reduces in float64, as ours does, so the answers
    # differ by one float32 rounding; a float32 frame's own rounding is far coarser in near-constant sections
    df = pd.DataFrame(x.reshape(d * s, c).astype(np.float64), index=index, columns=cols)
    return df[present.reshape(-1)], dates, syms


def build(spec: list, fit_range: tuple) -> qp.Processor:
    """A Qlib processor from [class name, kwargs]; the fit range goes to the classes that take one."""
    cls = getattr(qp, spec[0])
    kwargs = dict(spec[1])
    if "fit_start_time" in inspect.signature(cls.__init__).parameters:
        kwargs.update(fit_start_time=fit_range[0], fit_end_time=fit_range[1])
    return cls(**kwargs)


def unframe(df: pd.DataFrame, dates: pd.DatetimeIndex, syms: pd.Index, shape: tuple) -> tuple:
    """Qlib's output frame back onto the panel: values (NaN where no row) and the kept-rows mask."""
    out = np.full(shape, np.nan)
    kept = np.zeros(shape[:2], dtype=bool)
    di = dates.get_indexer(df.index.get_level_values("datetime"))
    si = syms.get_indexer(df.index.get_level_values("instrument"))
    out[di, si] = df.to_numpy(dtype=np.float64)
    kept[di, si] = True
    return out, kept


def serve(specs: list, path_in: str, path_out: str) -> None:
    case = np.load(path_in)
    x, present, n_feat = case["x"], case["present"], int(case["n_feat"])
    df, dates, syms = frame(x, present, n_feat)
    fit_range = (dates[int(case["fit_lo"])], dates[int(case["fit_hi"])])
    results = {}

    def put(name: str, out: pd.DataFrame) -> None:
        results[f"{name}.x"], results[f"{name}.kept"] = unframe(out, dates, syms, x.shape)

    for spec in specs:
        if "proc" in spec:
            proc = build(spec["proc"], fit_range)
            data = df.copy()  # Qlib's processors write in place
            proc.fit(data)
            put(spec["name"], proc(data))
        else:
            h = spec["handler"]
            handler = DataHandlerLP(
                data_loader=StaticDataLoader(config=df.copy()),
                infer_processors=[build(p, fit_range) for p in h["infer"]],
                learn_processors=[build(p, fit_range) for p in h["learn"]],
                process_type=h["process_type"])
            put(spec["name"] + ".infer", handler.fetch(col_set="__all", data_key=DataHandlerLP.DK_I))
            put(spec["name"] + ".learn", handler.fetch(col_set="__all", data_key=DataHandlerLP.DK_L))
    np.savez(path_out, **results)


def main() -> None:
    with open(sys.argv[1]) as f:
        specs = json.load(f)
    print("ready", flush=True)
    for line in sys.stdin:
        path_in, path_out = line.split()
        try:
            serve(specs, path_in, path_out)
            print("ok", flush=True)
        except Exception:  # the test reports Qlib's traceback with the failing case
            print("error " + json.dumps(traceback.format_exc()), flush=True)


if __name__ == "__main__":
    main()
