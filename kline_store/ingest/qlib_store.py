"""A Qlib provider directory <-> a store: ingest one value for value, export a store as one.

Ingest: the directory's calendar (``calendars/day.txt``) is the store's calendar; its instruments file
(``all`` by default, a market such as ``csi300``, or any file in that format) names the symbols, spelled as
the file spells them; every ``<field>.day.bin`` of those symbols becomes a field. Each stored value is the
float32 Qlib holds, NaN where Qlib has none. Rows are built a block at a time straight from the bin files and
written as a new generation under the caller's writer lock (ingestion.py takes it and cleans up a failure).
Qlib's data is taken as it is: no data-quality warnings, no factor policy (its ``$factor`` is stored as the
field ``factor``). The instruments file selects symbols, and its spans (index membership) are kept as a universe
of its name (``csi300``); so is every other instruments file of the directory whose symbols are all in the store
(``all.txt`` is the store's own symbols). A calendar of weekly or monthly dates makes a weekly or monthly store
(the rule of files: barsize.py), so a store exported to Qlib and ingested back keeps its bar size.

Export: the store's calendar; each symbol with a bar, from its first to its last bar (NaN inside where it has
no bar, nothing outside, as Qlib's ``dump_bin.py`` writes); every field, each value on the day it describes (a
features store's label moved back to its day: store/labels.py); every universe as ``instruments/<name>.txt``.
Written beside the target and renamed into place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from . import barsize, columns, panel, qlib_format
from ..store import NewVersion, bar_extent, labels, manifest as mf, universes
from ..errors import InputError
from ..progress import track
from .report import IngestReport
from ..store.snapshot import open_store
from .universes_in import Listing, to_spans
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
    hits = [p for p in paths if qlib_format.is_provider(p)]
    if not hits:
        if instruments is not None:
            raise InputError("--instruments applies to a Qlib provider directory (calendars/, instruments/, "
                             "features/); none among the inputs")
        return None
    if len(paths) > 1:
        raise InputError(f"{hits[0]}: a Qlib provider directory is ingested alone ({len(paths)} inputs given)")
    if calendar is not None:
        raise InputError(f"--calendar: {hits[0]} is a Qlib provider directory; its calendar is {qlib_format.CALENDAR}")
    if mapping or symbol_pattern:
        raise InputError(f"--{'map' if mapping else 'symbol-pattern'}: {hits[0]} is a Qlib provider directory; "
                         f"its symbols and fields are named by its files")
    return Provider(hits[0], instruments or "all")


@dataclass
class ProviderBuilt:
    """What an ingest of a provider directory committed."""

    manifest: dict
    n_files: int
    n_bars: int
    symbols: list[str]
    fields: list[str]
    dates: np.ndarray
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def report(self, store: Path, seconds: float) -> IngestReport:
        return IngestReport(store, self.manifest["version"], self.n_files, self.n_bars, len(self.symbols),
                            len(self.dates), str(self.dates[0]), str(self.dates[-1]), self.fields, self.problems,
                            0, {}, seconds, freq=self.manifest.get("bar", barsize.DAY), notes=self.notes)


def field_order(names: set[str]) -> list[str]:
    """open high low close volume amount (those present), then the others by name."""
    return [f for f in columns.BASE_FIELDS if f in names] + sorted(names - set(columns.BASE_FIELDS))


def build_store(src: Provider, out: Path, capacity: int | None = None) -> ProviderBuilt:
    """Write the provider's data as the next version of the store at ``out``; hold its writer lock."""
    calendar = qlib_format.read_calendar(src.root)
    listing = qlib_format.instruments_file(src.root, src.instruments)
    entries = qlib_format.read_instruments(listing)
    names = list(dict.fromkeys(span.symbol for span in entries))  # several spans: once
    files = {s: qlib_format.symbol_fields(src.root, s) for s in names}
    symbols = sorted(s for s in names if files[s])
    missing = [s for s in names if not files[s]]
    if not symbols:
        raise InputError(f"{listing}: none of its {len(names)} instrument(s) has feature files "
                         f"({src.root / 'features'}/<symbol>/<field>{qlib_format.SUFFIX})")
    kept, notes = markets(src.root, listing, entries, symbols, frozenset(missing), calendar)   # before writing
    bar = bar_size(calendar)
    fields = field_order({f for s in symbols for f in files[s]})
    n_days, nf = len(calendar), len(fields)
    first = np.full(len(symbols), -1, dtype=np.int64)
    last = np.full(len(symbols), -1, dtype=np.int64)
    n_bars = 0
    with NewVersion(out, len(symbols), n_days, nf, capacity, crash="qlib") as txn:
        step = panel.block_rows(n_days, nf)
        for lo in range(0, len(symbols), step):
            block = np.full((min(step, len(symbols) - lo), n_days, nf), np.nan, dtype=np.float32)
            for i, s in enumerate(symbols[lo: lo + len(block)]):
                start, values = qlib_format.read_symbol(files[s], fields, n_days)
                block[i, start: start + len(values)] = values
            present = np.isfinite(block).any(axis=2)     # a bar: a day with any value
            first[lo: lo + len(block)], last[lo: lo + len(block)] = bar_extent(present)
            n_bars += int(present.sum())
            txn.write(lo, block)
        n_files = sum(len(files[s]) for s in symbols)
        source = {"path": str(src.root), "format": "qlib", "freq": qlib_format.FREQ, "instruments": str(listing),
                  "symbols": len(symbols), "files": n_files}
        m = txn.commit(symbols=symbols, dates=calendar, fields=fields, first_bar=first, last_bar=last,
                       n_bars=n_bars, sources=[source],
                       extra={"calendar_source": str(src.root / qlib_format.CALENDAR), "adj_factor_source": None,
                              mf.STORE_ID_KEY: mf.new_store_id(),
                              **({"bar": bar} if bar != barsize.DAY else {}),
                              **({universes.KEY: kept} if kept else {})})
    problems = []
    if missing:
        problems.append(Problem("no_features", f"listed in {listing.name} without a features folder, left out",
                                len(missing), missing[:3], unit="instrument(s)"))
    return ProviderBuilt(m, n_files, n_bars, symbols, fields, calendar, problems, notes)


def bar_size(calendar: np.ndarray) -> str:
    """"1w" or "1mo" for a calendar of weekly or monthly dates (barsize.py's rule for a file's dates), else "1d"."""
    days = calendar.astype("datetime64[D]").astype(np.int64)
    zeros = np.zeros(len(days), dtype=np.int64)
    return barsize.by_file(days, zeros, zeros).get(0, barsize.DAY)


def markets(root: Path, listing: Path, entries: list[qlib_format.InstrumentLine], symbols: list[str],
            missing: frozenset[str], calendar: np.ndarray) -> tuple[dict, list[str]]:
    """The universes an ingest keeps (manifest value) and what the report says of them.

    The instruments file asked for is kept under its name unless it is ``all`` (the store's own symbols); its
    errors (a start after its end, overlapping spans) stop the ingest. Every other ``instruments/*.txt`` whose
    symbols with features are all in the store is kept too (symbols matched as Qlib does, ignoring case); one
    that is not, or whose lines do not check, is left out and named. Spans ending on the calendar's last day are
    kept open (Qlib's collectors write the data's last day for today's members).
    """
    last = calendar[-1].astype("datetime64[D]")
    kept: dict = {}
    opened = 0
    notes: list[str] = []
    own = listing.stem
    if own.lower() != "all":
        why = universes.name_problem(own)
        if why:
            notes.append(f"{listing}: not kept as a universe: {why}")
        else:
            checked = to_spans([Listing(e.symbol, e.first, e.last, f"{listing}: line {e.line}") for e in entries],
                               symbols, last, leave_out=missing)
            kept[own], opened = universes.encode(checked.spans, str(listing)), checked.opened
    others = sorted(p for p in (root / "instruments").glob("*.txt")
                    if p.stem.lower() != "all" and p.resolve() != listing.resolve() and p.is_file())
    left: list[str] = []
    has_data: dict[str, bool] = {}
    for path in others:
        name = path.stem
        if universes.name_problem(name) or name in kept:
            left.append(f"{path.name} ({'the name of ' + str(listing) if name in kept else 'not a universe name'})")
            continue
        try:
            lines = []
            for e in qlib_format.read_instruments(path):
                key = e.symbol.lower()
                if key not in has_data:       # instruments without features are left out, as for the file asked for
                    has_data[key] = (root / "features" / qlib_format.folder_name(e.symbol)).is_dir()
                if has_data[key]:
                    lines.append(e)
            checked = to_spans([Listing(e.symbol, e.first, e.last, f"{path}: line {e.line}") for e in lines],
                               symbols, last, fold_case=True, allow_unknown=True)
        except InputError as exc:
            left.append(f"{path.name} ({exc})")
            continue
        if checked.unknown or not checked.spans:
            left.append(f"{path.name} ({len(checked.unknown)} of its symbols are not in the store)" if checked.unknown
                        else f"{path.name} (none of its symbols has features)")
            continue
        kept[name], opened = universes.encode(checked.spans, str(path)), opened + checked.opened
    if kept:
        notes.append("universes " + ", ".join(f"{n} ({len(v['spans'])} symbols)" for n, v in sorted(kept.items()))
                     + (f"; {opened} span(s) end on the calendar's last day {last}: kept open (they grow with "
                        f"appended days)" if opened else ""))
    if left:
        notes.append(f"instruments files not kept as universes: {'; '.join(left[:5])}"
                     + (f"; ... and {len(left) - 5} more" if len(left) > 5 else ""))
    return kept, notes


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
        qlib_format.check_names(st.symbols, st.fields)
        writer = qlib_format.ProviderWriter(out, days, st.fields)
        ahead = labels.shifts(st.manifest, st.fields)
        every = list(range(st.n_fields))
        skipped = []
        try:
            for i in track(range(st.n_symbols), "exporting", unit="symbols"):
                a, b = int(st.first_bar[i]), int(st.last_bar[i])
                if a < 0:
                    skipped.append(st.symbols[i])
                    continue
                writer.add(st.symbols[i], a, labels.on_their_day(st.panel, np.array([i]), a, b, every, ahead)[0])
            for name in st.universes:
                writer.market(name, market_lines(st.manifest, name, set(skipped), str(days[-1])))
            writer.finish()
        except OSError as exc:
            writer.abort()
            raise InputError(f"{out}: cannot write the export ({exc.strerror or exc})") from None
        except BaseException:
            writer.abort()
            raise
        return Exported(out, st.n_symbols - len(skipped), list(st.fields), len(days), skipped)


def market_lines(m: dict, name: str, leave_out: set[str], last_day: str) -> list[tuple[str, str, str]]:
    """Universe ``name`` as instruments lines (symbol, first, last): an open span ends on the calendar's last
    day (as Qlib's collectors write today's members); symbols an export leaves out are left out here too."""
    spans = m[universes.KEY][name]["spans"]
    return [(s, a, b if b is not None else last_day) for s in sorted(spans) if s not in leave_out
            for a, b in spans[s] if b is not None or a <= last_day]   # an open span from after the calendar: no day
