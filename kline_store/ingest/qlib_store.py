"""A Qlib provider directory <-> a store: ingest one value for value, export a store as one.

Ingest: the directory's calendar (``calendars/day.txt``) is the store's calendar; its instruments file
(``all`` by default, a market such as ``csi300``, or any file in that format) names the symbols, spelled as
the file spells them; every ``<field>.day.bin`` of those symbols becomes a field. Each stored value is the
float32 Qlib holds, NaN where Qlib has none. Rows are built a block at a time straight from the bin files and
written as a new generation under the caller's writer lock (ingestion.py takes it and cleans up a failure).
Qlib's data is taken as it is: no data-quality warnings, no factor policy (its ``$factor`` is stored as the
field ``factor``). The instruments file selects symbols; their listing spans (index membership) are not kept.

Export: the store's calendar; each symbol with a bar, from its first to its last bar (NaN inside where it has
no bar, nothing outside, as Qlib's ``dump_bin.py`` writes); every field. Written beside the target and
renamed into place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from . import columns as C, panel as P, qlib_format as QF
from ..store import writer as W
from ..errors import InputError
from ..progress import track
from .report import IngestReport
from ..store.snapshot import open_store
from .validate import Problem


@dataclass(frozen=True)
class Provider:
    """A Qlib provider directory to ingest, and which instruments of it."""

    root: Path
    instruments: str = "all"      # a market of the directory (instruments/<name>.txt) or a file


def provider_input(inputs: Sequence[str | os.PathLike], instruments: str | None = None,
                   calendar: str | os.PathLike | None = None, mapping: dict[str, str] | None = None,
                   symbol_pattern: str | None = None) -> Provider | None:
    """The Qlib provider directory among ``inputs`` (it must come alone), or None when there is none.

    Options for files (``calendar``, ``mapping``, ``symbol_pattern``) are refused with a directory.
    """
    paths = [Path(str(i)) for i in inputs]
    hits = [p for p in paths if QF.is_provider(p)]
    if not hits:
        if instruments is not None:
            raise InputError("--instruments applies to a Qlib provider directory (calendars/, instruments/, "
                             "features/); none among the inputs")
        return None
    if len(paths) > 1:
        raise InputError(f"{hits[0]}: a Qlib provider directory is ingested alone ({len(paths)} inputs given)")
    if calendar is not None:
        raise InputError(f"--calendar: {hits[0]} is a Qlib provider directory; its calendar is {QF.CALENDAR}")
    if mapping or symbol_pattern:
        raise InputError(f"--{'map' if mapping else 'symbol-pattern'}: {hits[0]} is a Qlib provider directory; "
                         f"its symbols and fields are named by its files")
    return Provider(hits[0], instruments or "all")


@dataclass
class Built:
    """What an ingest of a provider directory committed."""

    manifest: dict
    n_files: int
    n_bars: int
    symbols: list[str]
    fields: list[str]
    dates: np.ndarray
    problems: list[Problem] = field(default_factory=list)

    def report(self, store: Path, seconds: float) -> IngestReport:
        return IngestReport(store, self.manifest["version"], self.n_files, self.n_bars, len(self.symbols),
                            len(self.dates), str(self.dates[0]), str(self.dates[-1]), self.fields, self.problems,
                            0, {}, seconds)


def field_order(names: set[str]) -> list[str]:
    """open high low close volume amount (those present), then the others by name."""
    return [f for f in C.BASE_FIELDS if f in names] + sorted(names - set(C.BASE_FIELDS))


def build_store(src: Provider, out: Path, capacity: int | None = None) -> Built:
    """Write the provider's data as the next version of the store at ``out``; hold its writer lock."""
    calendar = QF.read_calendar(src.root)
    listing = QF.instruments_file(src.root, src.instruments)
    names = list(dict.fromkeys(span.symbol for span in QF.read_instruments(listing)))  # several spans: once
    files = {s: QF.symbol_fields(src.root, s) for s in names}
    symbols = sorted(s for s in names if files[s])
    missing = [s for s in names if not files[s]]
    if not symbols:
        raise InputError(f"{listing}: none of its {len(names)} instrument(s) has feature files "
                         f"({src.root / 'features'}/<symbol>/<field>{QF.SUFFIX})")
    fields = field_order({f for s in symbols for f in files[s]})
    n_days, nf = len(calendar), len(fields)
    version, generation, _ = W.next_numbers(out)
    first = np.full(len(symbols), -1, dtype=np.int64)
    last = np.full(len(symbols), -1, dtype=np.int64)
    n_bars = 0
    gen = W.NewGeneration(out, generation + 1, len(symbols), n_days, nf, capacity)
    try:
        step = P.block_rows(n_days, nf)
        for lo in range(0, len(symbols), step):
            block = np.full((min(step, len(symbols) - lo), n_days, nf), np.nan, dtype=np.float32)
            for i, s in enumerate(symbols[lo: lo + len(block)]):
                start, values = QF.read_symbol(files[s], fields, n_days)
                block[i, start: start + len(values)] = values
            present = np.isfinite(block).any(axis=2)     # a bar: a day with any value
            first[lo: lo + len(block)], last[lo: lo + len(block)] = W.bar_extent(present)
            n_bars += int(present.sum())
            gen.write(lo, block)
        data = gen.finish()
    except BaseException:
        gen.abort()
        raise
    n_files = sum(len(files[s]) for s in symbols)
    source = {"path": str(src.root), "format": "qlib", "freq": QF.FREQ, "instruments": str(listing),
              "symbols": len(symbols), "files": n_files}
    m = W.build_manifest(version=version + 1, data=data, symbols=symbols, dates=calendar, fields=fields,
                         capacity=gen.capacity, first_bar=first, last_bar=last, n_bars=n_bars, sources=[source],
                         extra={"calendar_source": str(src.root / QF.CALENDAR), "adj_factor_source": None})
    try:
        m = W.commit(out, m)
    except BaseException:
        W.discard_uncommitted(out, data["file"])
        raise
    problems = []
    if missing:
        problems.append(Problem("no_features", f"listed in {listing.name} without a features folder, left out",
                                len(missing), missing[:3], unit="instrument(s)"))
    return Built(m, n_files, n_bars, symbols, fields, calendar, problems)


@dataclass
class Exported:
    """What an export to a provider directory wrote."""

    out: Path
    symbols: int
    fields: list[str]
    days: int
    without_bars: list[str]      # symbols the store lists but that have no bar: Qlib has no place for them


def export_provider(store: str | os.PathLike, out: str | os.PathLike) -> Exported:
    """Write the store at ``store`` as a Qlib provider directory ``out`` (day frequency, every field).

    ``out`` must not exist or be an empty folder. Afterwards ``qlib.init(provider_uri=out)`` and
    ``D.features(D.instruments("all"), ["$close", ...])`` read the store's values back.
    """
    out = Path(out)
    with open_store(store) as st:
        days = st.dates.astype("datetime64[D]")
        if len(np.unique(days)) != len(days) or bool((days != st.dates).any()):
            raise InputError(f"{store}: bars with a time of day; a Qlib export writes day bars only")
        QF.check_names(st.symbols, st.fields)
        writer = QF.ProviderWriter(out, days, st.fields)
        skipped = []
        try:
            for i in track(range(st.n_symbols), "exporting", unit="symbols"):
                a, b = int(st.first_bar[i]), int(st.last_bar[i])
                if a < 0:
                    skipped.append(st.symbols[i])
                    continue
                writer.add(st.symbols[i], a, np.asarray(st.panel[i, a: b + 1, :]))
            writer.finish()
        except OSError as exc:
            writer.abort()
            raise InputError(f"{out}: cannot write the export ({exc.strerror or exc})") from None
        except BaseException:
            writer.abort()
            raise
        return Exported(out, st.n_symbols - len(skipped), list(st.fields), len(days), skipped)
