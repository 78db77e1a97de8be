"""Qlib's side of the interoperability tests; runs in the separate Qlib virtualenv (.venv-qlib), never imported.

    python helpers_qlib.py write CSV_DIR OUT    a provider directory written by Qlib's own storage classes
    python helpers_qlib.py read DIR OUT.npz     every feature of every instrument, as D.features returns them
    python helpers_qlib.py dump_all DUMP_BIN CSV_DIR OUT   the directory made by Qlib's scripts/dump_bin.py
    python helpers_qlib.py features DIR SPEC.json OUT.npz  D.features(D.instruments(market), exprs)
    python helpers_qlib.py handler DIR SPEC.json OUT.npz   DataHandlerLP(instruments=market, ...)'s learn view

`write`: the pyqlib wheel does not ship scripts/dump_bin.py, so the directory is written the way dump_bin
lays it out, through Qlib's own writers: FileCalendarStorage for the calendar (the union of the files'
dates), FileFeatureStorage.write for the values, one contiguous run of a symbol's days at a time, so that
Qlib itself pads the days a symbol lacks inside its span with NaN. instruments/all.txt is written here, one
line per symbol: FileInstrumentStorage._write_instrument writes its columns as start, end, instrument (a
second to_csv overwrites the first), a file Qlib's own reader then misreads. Instruments are named as Qlib's
cn_data names A-shares (SH600000, SZ000001): upper case in all.txt, lower-case folders.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def instrument(code: str) -> str:
    return ("SH" if code.startswith("6") else "SZ") + code


def write(csv_dir: Path, out: Path) -> None:
    import qlib
    from qlib.data.storage.file_storage import FileCalendarStorage, FileFeatureStorage

    frames = {f.stem: pd.read_csv(f) for f in sorted(csv_dir.glob("*.csv"))}
    for sub in ("calendars", "instruments", "features"):
        (out / sub).mkdir(parents=True)
    days = sorted(set().union(*(set(df["date"]) for df in frames.values())))
    uri = {"day": str(out)}
    qlib.init(provider_uri=str(out), region="cn")
    FileCalendarStorage(freq="day", future=False, provider_uri=uri).extend(days)
    index = {d: i for i, d in enumerate(days)}
    lines = []
    for code, df in frames.items():
        name = instrument(code)
        pos = df["date"].map(index).to_numpy()
        order = np.argsort(pos)
        pos = pos[order]
        runs = np.split(np.arange(len(pos)), np.flatnonzero(np.diff(pos) != 1) + 1)
        for field in ("open", "high", "low", "close", "volume"):
            (out / "features" / name.lower()).mkdir(exist_ok=True)
            store = FileFeatureStorage(name, field, "day", provider_uri=uri)
            values = df[field].to_numpy()[order]
            for run in runs:
                store.write(values[run], index=int(pos[run[0]]))
        lines.append(f"{name}\t{days[pos[0]]}\t{days[pos[-1]]}\n")
    (out / "instruments" / "all.txt").write_text("".join(sorted(lines)))


def read(root: Path, out: Path) -> None:
    import qlib
    from qlib.data import D

    qlib.init(provider_uri=str(root), region="cn")
    fields = sorted(p.name.split(".")[0] for p in next((root / "features").iterdir()).glob("*.day.bin"))
    df = D.features(D.instruments("all"), [f"${f}" for f in fields], freq="day")
    np.savez(out, instrument=np.asarray(df.index.get_level_values(0), dtype=str),
             date=df.index.get_level_values(1).to_numpy().astype("datetime64[D]"),
             values=df.to_numpy(dtype=np.float32), fields=np.asarray(fields, dtype=str),
             dtypes=np.asarray([str(t) for t in df.dtypes], dtype=str))


def dump_all(dump_bin: Path, csv_dir: Path, out: Path) -> None:
    subprocess.run([sys.executable, str(dump_bin), "dump_all", "--data_path", str(csv_dir), "--qlib_dir", str(out),
                    "--freq", "day", "--date_field_name", "date", "--file_suffix", ".csv",
                    "--include_fields", "open,close,high,low,volume", "--max_workers", "2"], check=True)


def _frame_out(df: pd.DataFrame, out: Path, names: list[str]) -> None:
    """A Qlib frame indexed by (instrument, datetime) or (datetime, instrument) as arrays, float64 values."""
    inst = df.index.get_level_values("instrument")
    when = df.index.get_level_values("datetime")
    np.savez(out, instrument=np.asarray(inst, dtype=str), date=when.to_numpy().astype("datetime64[D]"),
             values=df.to_numpy(dtype=np.float64), names=np.asarray(names, dtype=str))


def features(root: Path, spec_path: Path, out: Path) -> None:
    """SPEC: {"market", "exprs"}: every row D.features gives for the market's members, each expression."""
    import json

    import qlib
    from qlib.data import D

    spec = json.loads(Path(spec_path).read_text())
    qlib.init(provider_uri=str(root), region="cn")
    df = D.features(D.instruments(spec["market"]), spec["exprs"], freq="day")
    df.index = df.index.set_names(["instrument", "datetime"])
    _frame_out(df[spec["exprs"]], out, spec["exprs"])


def handler(root: Path, spec_path: Path, out: Path) -> None:
    """SPEC: {"market", "exprs", "names", "label", "fit_start", "fit_end"}: Qlib's benchmark processing
    (RobustZScoreNorm + Fillna on the features, DropnaLabel + CSRankNorm on the label) of the market's rows."""
    import json

    import qlib
    from qlib.data.dataset import processor as qp
    from qlib.data.dataset.handler import DataHandlerLP

    spec = json.loads(Path(spec_path).read_text())
    qlib.init(provider_uri=str(root), region="cn")
    fit = dict(fit_start_time=spec["fit_start"], fit_end_time=spec["fit_end"])
    h = DataHandlerLP(
        instruments=spec["market"],
        data_loader={"class": "QlibDataLoader", "module_path": "qlib.data.dataset.loader",
                     "kwargs": {"config": {"feature": (spec["exprs"], spec["names"]),
                                           "label": ([spec["label"]], ["LABEL0"])}}},
        infer_processors=[qp.RobustZScoreNorm(fields_group="feature", clip_outlier=True, **fit),
                          qp.Fillna(fields_group="feature")],
        learn_processors=[qp.DropnaLabel(), qp.CSRankNorm(fields_group="label")])
    df = h.fetch(col_set=["feature", "label"], data_key=DataHandlerLP.DK_L)
    df.columns = df.columns.get_level_values(-1)
    _frame_out(df[spec["names"] + ["LABEL0"]], out, spec["names"] + ["LABEL0"])


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"write": write, "read": read, "dump_all": dump_all, "features": features,
     "handler": handler}[cmd](*map(Path, args))
