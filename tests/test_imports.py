"""The package's imports flow one way: every module imports only modules below it in the data flow (function-level
imports included), so there is no cycle and no lazy import hiding one. A new module must take its place here."""

from __future__ import annotations

import ast
from pathlib import Path

import kline_store

PACKAGE = Path(kline_store.__file__).parent

# Bottom to top: files -> store -> windows -> gather -> loader -> dataset -> measuring tools -> CLI.
LAYERS = [
    # shared
    "errors", "progress",
    # ingest half: files -> store
    "columns", "timeaxis", "sessions", "safefs", "manifest", "lock", "snapshot", "writer", "store", "qlib_format",
    "inputs", "textscan", "dates", "adjust", "readers", "validate", "bars", "panel", "report", "qlib_store",
    "ingestion", "update", "exporter", "resample",
    # training half: store -> windows -> gather -> loader -> dataset
    "background", "ranges", "spec", "sampling", "windows", "batches", "transforms", "gather", "buffers", "placement", "config",
    "prefetch", "shm", "workers", "device", "loader", "collate", "dataset", "cross_section", "splits", "lightning",
    # on top: measuring and tuning
    "timing", "meter", "synthetic", "tune", "classic", "bench",
    # the command line and the package
    "cli_perf", "cli", "__init__",
]


def _imports(path: Path) -> set[str]:
    """Package modules imported anywhere in ``path`` (relative or absolute, at any depth)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1 or base.startswith("kline_store"):
                base = base.removeprefix("kline_store").lstrip(".")
                if base:
                    out.add(base.split(".")[0])
                else:  # from . import windows as W
                    out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kline_store."):
                    out.add(a.name.split(".")[1])
    return out


def test_every_module_has_a_layer():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules == set(LAYERS), f"place new modules in LAYERS: {sorted(modules ^ set(LAYERS))}"


def test_imports_point_down():
    rank = {m: i for i, m in enumerate(LAYERS)}
    upward = []
    for name in LAYERS:
        for dep in sorted(_imports(PACKAGE / f"{name}.py")):
            if dep not in rank:
                upward.append(f"{name} imports unknown {dep}")
            elif rank[dep] >= rank[name]:
                upward.append(f"{name} imports {dep}, which is not below it")
    assert upward == []


def test_the_parser_sees_every_kind_of_import(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from . import windows as W\nfrom .store import open_store\nimport kline_store.loader\n"
                   "def f():\n    from kline_store.dataset import KlineDataset\n")
    assert _imports(src) == {"windows", "store", "loader", "dataset"}
