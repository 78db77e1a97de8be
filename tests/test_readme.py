"""The documents' code runs as written: every ```python and ```bash block of README.md, CONTRIBUTING.md and
docs/**/*.md, in one scratch copy of the repository. README's quick start runs first: it builds ``demo_store`` and
``demo_store_alpha158`` as scripts/demo.sh does, and every guide's examples use them. A block tagged ``no-run``
(```python no-run, ```bash no-run) is not run: it needs CUDA, a model, your own files or another virtualenv
(CONTRIBUTING.md, "Documents")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import ROOT

# Documents in the order their examples run (README's quick start builds the stores the others use); any other
# document with runnable blocks runs after these, in name order.
FIRST = ["README.md", "docs/guide/ingest.md", "docs/guide/training.md", "docs/guide/features.md",
         "docs/guide/daily.md", "docs/guide/intraday.md", "docs/guide/big-stores.md", "docs/guide/qlib.md"]
RUN = {"python", "bash"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", flags=re.M | re.S)


class Block(NamedTuple):
    doc: str
    line: int
    lang: str
    code: str
    runs: bool


def documents() -> list[str]:
    found = {"README.md", "CONTRIBUTING.md"} | {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}
    return [d for d in FIRST if d in found] + sorted(found - set(FIRST))


def blocks(doc: str) -> list[Block]:
    """Every fenced block of ``doc``: its first line, language, code, and whether it is meant to run."""
    text = (ROOT / doc).read_text()
    out = []
    for m in FENCE.finditer(text):
        info = m.group(1).split()
        lang = info[0] if info else ""
        out.append(Block(doc, text.count("\n", 0, m.start()) + 1, lang, m.group(2),
                         lang in RUN and "no-run" not in info[1:]))
    return out


def _env() -> dict:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def run_block(block: Block, cwd: Path) -> None:
    where = f"{block.doc}:{block.line}"
    if block.lang == "python":
        cmd = [sys.executable, "-W", "error::UserWarning", "-c", block.code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, f"{where}: exit {r.returncode}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr, f"{where}:\n{r.stderr[-3000:]}"
    if block.lang == "python":
        assert r.stderr == "", f"{where}: wrote to stderr\n{r.stderr[-3000:]}"


def quick_start() -> Block:
    first = [b for b in blocks("README.md") if b.runs]
    assert first and first[0].lang == "python", "README's first runnable block is the Python quick start"
    return first[0]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A place that looks like the repository after README's quick start (or scripts/demo.sh)."""
    root = tmp_path_factory.mktemp("repo")
    os.symlink(ROOT / "sample_data", root / "sample_data")
    run_block(quick_start(), root)
    for store in ("demo_store", "demo_store_alpha158", "demo_store_alpha158_p"):
        assert (root / store / "manifest.json").is_file(), store
    return root


def test_the_quick_start_builds_the_stores_of_scripts_demo_sh():
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    code = quick_start().code
    assert '"sample_data/us_yahoo_daily"' in code and "sample_data/us_yahoo_daily" in demo
    assert '"demo_store_alpha158"' in code and "_alpha158" in demo    # the name the guides use, both ways
    assert "ks.watch(" in code and ".loader(" in code and "make_splits(" in code


@pytest.mark.parametrize("doc", [d for d in documents() if any(b.runs for b in blocks(d))])
def test_the_examples_of_each_document_run(repo, doc):
    todo = [b for b in blocks(doc) if b.runs]
    if doc == "README.md":
        todo = todo[1:]                  # the quick start ran in the fixture
    for block in todo:
        run_block(block, repo)


def test_every_guide_has_examples_that_run():
    for guide in sorted((ROOT / "docs" / "guide").glob("*.md")):
        doc = guide.relative_to(ROOT).as_posix()
        assert doc in FIRST, f"add {doc} to FIRST (the order the documents' examples run in)"
        assert any(b.runs for b in blocks(doc)), f"{doc}: no python or bash block that runs"


def test_code_blocks_name_their_language():
    for doc in documents():
        for b in blocks(doc):
            assert b.lang, f"{doc}:{b.line}: a code block without a language (```text for output)"


def test_help_does_not_cut_command_summaries():
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([sys.executable, "-m", "kline_store.cli", "--help"], capture_output=True, text=True,
                         env=env).stdout
    commands = out.split("Commands:\n", 1)[1]
    assert "..." not in commands
    from kline_store.cli.main import cli
    for name, cmd in cli.commands.items():
        assert cmd.short_help and len(cmd.short_help) <= 60, name   # fits beside the name in 80 columns
        assert cmd.short_help in commands, name
