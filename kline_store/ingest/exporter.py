"""Export a store back to long format: one row per existing bar (symbol, date or time, <fields>); or, with
``fmt="qlib"``, as a Qlib provider directory (qlib_store.py).

A daily store's rows carry a ``date``; an intraday store's a ``time`` (its bar stamp, local and naive), which
``ingest`` reads back as the same bars.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from ..errors import InputError
from .inputs import check_address_space
from .qlib_store import export_provider
from ..store import safefs
from ..store.snapshot import open_store


def to_frame(path: str | os.PathLike, universe: str | None = None) -> pl.DataFrame:
    """The store as a long polars frame, sorted by (symbol, date); a bar is a cell with any finite field, every
    value on the row of the day it describes (``Store.to_polars``: a features store's label moved back to its day).
    ``universe``: only its members' rows on their member days."""
    with open_store(path) as st:
        return st.to_polars(universe=universe)


def export(path: str | os.PathLike, out: str | os.PathLike, fmt: str | None = None, *,
           symbols: list[str] | None = None, start: object = None, end: object = None,
           universe: str | None = None) -> int:
    """Write ``to_frame(path)`` to ``out`` (.parquet or .csv), atomically; returns the number of rows.

    ``fmt``: "parquet", "csv" (default: from the suffix of ``out``) or "qlib": a provider directory ``out``
    (every universe as ``instruments/NAME.txt``); returns the number of symbols written then. ``symbols``,
    ``start``, ``end``: a selection (long formats; partial dates as in pandas, see ``Store.to_polars``);
    ``universe``: only its members' rows on their member days (Qlib's ``D.features(D.instruments(NAME), ...)``).
    Every value is on the row of the day it describes (a features store's label too).
    """
    selection = symbols is not None or start is not None or end is not None or universe is not None
    safefs.outside_store(path, out)
    check_address_space()
    if fmt == "qlib":
        if selection:
            raise InputError("--symbols/--start/--end/--universe: not with --format qlib (it writes the whole store, "
                             "each universe as instruments/NAME.txt)")
        _make_folder(Path(out).parent)   # a provider directory in a new nested folder
        return export_provider(path, out).symbols
    out = Path(out)
    suffix = {"parquet": ".parquet", "csv": ".csv"}.get(fmt or "", out.suffix.lower())
    if suffix not in (".parquet", ".pq", ".csv"):
        raise InputError(f"{out}: unknown export format (use .parquet or .csv, or --format qlib for a directory)")
    _make_folder(out.parent)   # export into a new nested folder
    if not out.parent.is_dir():
        raise InputError(f"{out}: folder {out.parent} does not exist")
    with open_store(path) as st:
        df = st.to_polars(symbols, start, end, universe=universe)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        if suffix == ".csv":
            _whole_numbers(df).write_csv(tmp, datetime_format="%Y-%m-%d %H:%M:%S")
        else:
            df.write_parquet(tmp)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{out}: cannot write the export ({exc.strerror or exc})") from None
    except pl.exceptions.PolarsError as exc:   # polars reports a full disk or an I/O error as its own kinds
        tmp.unlink(missing_ok=True)
        raise InputError(f"{out}: cannot write the export ({' '.join(str(exc).split())[:200]})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return df.height


def _make_folder(folder: Path) -> None:
    """The export's folder, made with its parents when missing; one line when it cannot be."""
    if folder.is_dir():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{folder}: cannot make the export's folder ({exc.strerror or exc})") from None


def _whole_numbers(df: pl.DataFrame) -> pl.DataFrame:
    """CSV text as a person wrote it: a value column whose every value is a whole number (volumes, counts) is
    written without ``.0`` (``936660000``, not ``936660000.0``); it reads back as the same float32."""
    out = []
    for c, dt in df.schema.items():
        if dt.is_float():
            col = df[c].fill_nan(None)
            vals = col.drop_nulls()
            if vals.len() and bool((vals == vals.round(0)).all()) and float(vals.abs().max()) < 2 ** 53:
                out.append(col.cast(pl.Int64))
                continue
        out.append(df[c])
    return pl.DataFrame(out)
