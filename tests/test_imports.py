"""The package's imports flow one way, between wings and between the modules of a wing: every module imports
only wings it may depend on and, inside its own wing, only modules below it (function-level imports included),
so there is no cycle and no lazy import hiding one. A new module or wing must take its place here."""

from __future__ import annotations

import ast
from pathlib import Path

import kline_store

PACKAGE = Path(kline_store.__file__).parent

# The top level: shared bottom modules (and the package system/: cores, pages, background threads, the ranks'
# agreement, index widths), and what users import from the package itself.
SHARED = ["errors", "progress", "memory", "system"]
TOP = ["lightning", "__init__"]

# Wings and the wings each may import (besides SHARED). The data flow, file to GPU:
#   store <- ingest, features;   store <- feed <- samples <- measure <- cli
WING_DEPS = {
    "store": set(),
    "ingest": {"store"},
    "features": {"store"},
    "feed": {"store"},
    "samples": {"store", "feed", "features"},
    "measure": {"store", "ingest", "feed", "samples"},
    "cli": {"store", "ingest", "features", "feed", "samples", "measure"},
}
TOP_DEPS = {"lightning": {"feed", "samples"}, "__init__": set(WING_DEPS)}

# Inside each wing, bottom to top. The wing's __init__ comes last: it may re-export its modules.
LAYERS = {
    "system": ["indexes", "cores", "background", "pages", "ranks", "__init__"],
    "store": ["safefs", "universes", "manifest", "lock", "reclaim", "timeaxis", "periods", "labels", "to_frames", "sessions", "snapshot", "identity", "generation", "transaction", "writer", "blockwriter", "__init__"],
    "ingest": ["columns", "options", "preamble", "clock", "from_frames", "packed", "qlib_format", "inputs", "textscan", "dates", "exchanges", "adjust", "wide", "sources", "readers", "validate", "sink", "bar_gaps", "bars", "grid", "barsize", "calnote",
               "panel", "panel_layout", "report", "universes_in", "qlib_store", "ingestion", "update", "exporter", "resample", "__init__"],
    "feed": ["source", "background", "sampling", "options", "states", "agreement", "block_order", "batches", "buffers", "placement",
             "config", "block_feed", "prefetch", "shm", "workers", "device", "chunks", "host", "loader", "collate", "__init__"],
    "samples": ["ranges", "spec", "count_cache", "windows", "block_pages", "segments", "blocks", "day_blocks", "coverage",
                "transforms", "gather", "dataset", "cross_section", "splits", "feature_windows", "__init__"],
    "measure": ["timing", "meter", "synthetic", "footprint", "shuffle", "tune", "classic", "bench_rows",
                "bench_report", "bench", "__init__"],
    "features": ["nodes", "fold", "parse", "window", "compiled", "kernels", "moments", "infinity", "rolling", "smooth",
                 "cross_section", "ops", "stages", "evaluate", "alpha101", "sets",
                 "plan", "pagecache", "compute", "processors", "fit", "process", "__init__"],
    "cli": ["perf", "features", "options", "main", "__init__", "__main__"],
}


def _imports(path: Path, rel: tuple[str, ...] | None = None) -> set[tuple[str, ...]]:
    """Package modules imported anywhere in ``path`` (relative or absolute, at any depth), as dotted parts
    under kline_store: ('store', 'writer'), ('errors',), ('feed',) for the wing package itself. ``rel``: the
    file's place in the package, when it is not inside it."""
    rel = rel or path.relative_to(PACKAGE).with_suffix("").parts
    here = rel[:-1]                      # the package the file lives in
    out: set[tuple[str, ...]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                mod = tuple(base) + tuple((node.module or "").split(".") if node.module else ())
            elif (node.module or "").startswith("kline_store"):
                mod = tuple(node.module.split(".")[1:])
            else:
                continue
            if node.module:
                out.add(mod)
            else:                        # from . import windows as W; from .. import progress
                out.update(mod + (a.name,) for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(tuple(a.name.split(".")[1:]) for a in node.names if a.name.startswith("kline_store."))
    return {m for m in out if m}


def _files() -> dict[tuple[str, ...], Path]:
    return {p.relative_to(PACKAGE).with_suffix("").parts: p for p in PACKAGE.rglob("*.py")}


def test_every_module_has_a_layer():
    placed = {(m,) for m in SHARED + TOP if m not in LAYERS} | {(w, m) for w, ms in LAYERS.items() for m in ms}
    found = set(_files())
    assert found == placed, f"place new modules in LAYERS: {sorted(found ^ placed)}"


def test_imports_point_down():
    layers = LAYERS
    wrong = []
    for key, path in sorted(_files().items()):
        for dep in sorted(_imports(path)):
            who, what = ".".join(key), ".".join(dep)
            if dep[0] in SHARED and dep[0] != key[0]:
                if key[0] in SHARED and SHARED.index(dep[0]) >= SHARED.index(key[0]):
                    wrong.append(f"{who} imports {what}, which is not below it")
                continue
            if dep[0] in TOP:
                wrong.append(f"{who} imports {what}: nothing imports the top level")
                continue
            if dep[0] not in layers:
                wrong.append(f"{who} imports unknown {what}")
                continue
            if len(key) == 1:            # a top-level module
                allowed = TOP_DEPS.get(key[0], set())
                if dep[0] not in allowed:
                    wrong.append(f"{who} imports the wing {dep[0]}, which it may not")
                continue
            wing = key[0]
            if dep[0] != wing:
                if dep[0] not in WING_DEPS[wing]:
                    wrong.append(f"{who} imports {what}: the wing {wing} may not import the wing {dep[0]}")
                continue
            order = layers[wing]
            mod = dep[1] if len(dep) > 1 else "__init__"
            if mod not in order or order.index(mod) >= order.index(key[1]):
                wrong.append(f"{who} imports {what}, which is not below it in its wing")
    assert wrong == []


# What samples/ takes from feed/: only what offering a loader needs (the loader, its options, the protocols a source
# implements, the batch a source gathers, the worker ring). Shared utilities live in system/.
SAMPLES_FROM_FEED = {"loader", "options", "source", "collate", "shm"}


def test_samples_take_from_feed_only_what_offering_a_loader_needs():
    taken = {dep[1] if len(dep) > 1 else "__init__" for key, path in _files().items() if key[0] == "samples"
             for dep in _imports(path) if dep[0] == "feed"}
    assert taken <= SAMPLES_FROM_FEED, f"samples/ imports feed/{sorted(taken - SAMPLES_FROM_FEED)}"


def test_no_module_over_500_lines():
    long = {".".join(k): n for k, p in _files().items() if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_the_parser_sees_every_kind_of_import(tmp_path):
    src = tmp_path / "probe.py"
    src.write_text("from . import windows as W\nfrom ..store import open_store\nimport kline_store.feed.loader\n"
                   "from .. import progress\n"
                   "def f():\n    from kline_store.samples.dataset import KlineDataset\n")
    assert _imports(src, ("samples", "probe")) == {("samples", "windows"), ("store",), ("feed", "loader"),
                                                   ("progress",), ("samples", "dataset")}


def test_importing_the_package_is_light():
    """`import kline_store` (and the ingest CLI's modules) load neither torch nor polars."""
    import subprocess
    import sys
    code = ("import sys, kline_store, kline_store.ingest, kline_store.cli.main; "
            "print(sorted(m for m in ('torch', 'polars') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_ingest_is_still_the_function():
    import kline_store as ks
    import kline_store.ingest.ingestion  # noqa: F401  (a submodule import must not rebind ks.ingest)
    assert callable(ks.ingest) and ks.ingest.__module__ == "kline_store.ingest.ingestion"


def import_graph() -> list[str]:
    """One line per importing wing (or top-level module): each wing it imports and, across wings, the names of the
    modules it reaches there. ``pytest -s tests/test_imports.py -k graph`` prints it."""
    edges: dict[str, dict[str, set[str]]] = {}
    for key, path in sorted(_files().items()):
        who = key[0]
        for dep in _imports(path):
            if dep[0] == who:
                continue
            edges.setdefault(who, {}).setdefault(dep[0], set()).add(".".join(dep[1:]) or "__init__")
    return [f"{who} -> {wing}: {', '.join(sorted(mods))}" for who in sorted(edges)
            for wing, mods in sorted(edges[who].items())]


def test_print_import_graph():
    lines = import_graph()
    assert lines and all(" -> " in line for line in lines)
    print("\n" + "\n".join(lines))
