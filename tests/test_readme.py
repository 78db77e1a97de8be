"""README examples run as written: the demo-store commands of "Quick start" and the Python examples of "The
store" and "Training data", on the store scripts/demo.sh builds (``STORE`` stands for it there)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

README = (ROOT / "README.md").read_text()
PYTHON_SECTIONS = ("The store", "Training data", "Features")   # "Keeping the GPU fed" needs CUDA and a model


def blocks(lang: str) -> list[tuple[str, str]]:
    """(section heading, code) of every ```lang block, in order."""
    out, section = [], ""
    for part in re.split(r"^(## .*)$", README, flags=re.M):
        if part.startswith("## "):
            section = part[3:].strip()
            continue
        out += [(section, code) for code in re.findall(rf"^```{lang}\n(.*?)^```", part, flags=re.M | re.S)]
    return out


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory) -> Path:
    """A place that looks like the repository after scripts/demo.sh: sample_data/ and demo_store/."""
    root = tmp_path_factory.mktemp("repo")
    os.symlink(ROOT / "sample_data", root / "sample_data")
    r = subprocess.run([sys.executable, "-m", "kline_store.cli", "ingest", "sample_data/us_yahoo_daily", "-o",
                        "demo_store", "--replace"], cwd=root, capture_output=True, text=True)   # as demo.sh does
    assert r.returncode == 0, r.stderr
    return root


def test_the_demo_store_commands_run(repo_copy):
    demo = [code for section, code in blocks("bash") if section == "Quick start" and "demo_store" in code]
    assert len(demo) == 1
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for line in demo[0].splitlines():
        r = subprocess.run(line, shell=True, cwd=repo_copy, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, (line, r.stderr)
        assert "Warning" not in r.stderr and "Traceback" not in r.stderr, (line, r.stderr)
    assert "wrote 30 symbols" in subprocess.run("kline-store export demo_store --format qlib -o q2", shell=True,
                                                cwd=repo_copy, capture_output=True, text=True, env=env).stdout


@pytest.mark.parametrize("section", PYTHON_SECTIONS)
def test_python_examples_run_on_the_demo_store(repo_copy, section):
    codes = [code for s, code in blocks("python") if s == section]
    assert codes, f"no python example under {section!r}"
    for code in codes:
        r = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code.replace('"STORE"', '"demo_store"')],
                           cwd=repo_copy, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stderr == "", r.stderr


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
