"""The documents hold together: links reach files and headings that exist, the wing table of docs/architecture.md
is the one tests/test_imports.py enforces, every command-line option has a line in docs/reference/cli.md, and the
README stays a front door."""

from __future__ import annotations

import re

import click

from conftest import ROOT
from test_imports import SHARED, WING_DEPS

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _documents() -> list:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.*)$", _prose(text), flags=re.M)}


def test_links_reach_files_and_headings_that_exist():
    broken = []
    for doc in _documents():
        text = doc.read_text()
        for target in LINK.findall(_prose(text)):
            if re.match(r"[a-z]+:", target):
                continue                              # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)}: {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def wing_table() -> tuple[dict[str, set[str]], set[str]]:
    """The wings of docs/architecture.md's table with what each may import, and the shared modules its header names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The wings", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = rows[0].split("|")[3]
    wings = {}
    for row in rows[2:]:
        cells = row.split("|")
        name = re.fullmatch(r"\s*`(\w+)/`\s*", cells[1])
        assert name, f"docs/architecture.md: a wing row that does not start with `wing/`: {row[:60]}"
        wings[name.group(1)] = set(re.findall(r"`(\w+)`", cells[3]))
    return wings, set(re.findall(r"`(\w+)`", header))


def test_the_wing_table_is_the_one_test_imports_enforces():
    wings, shared = wing_table()
    assert set(wings) == set(WING_DEPS), "docs/architecture.md's wing table and WING_DEPS in tests/test_imports.py"
    for wing, deps in WING_DEPS.items():
        assert wings[wing] == deps, f"{wing}: the table says {sorted(wings[wing])}, test_imports {sorted(deps)}"
    assert shared == set(SHARED)


def cli_sections() -> dict[str, str]:
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    parts = re.split(r"^### `kline-store (\w+)`$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_command_and_option_has_a_line_in_the_cli_reference():
    from kline_store.cli.main import cli
    sections = cli_sections()
    assert set(sections) == set(cli.commands), "docs/reference/cli.md: one '### `kline-store NAME`' per command"
    missing = []
    for name, cmd in cli.commands.items():
        for param in cmd.params:
            if isinstance(param, click.Option) and "--help" not in param.opts:
                flag = max(param.opts, key=len)
                if not re.search(rf"`{re.escape(flag)}`", sections[name]):
                    missing.append(f"kline-store {name} {flag}")
    assert not missing, "add a line to docs/reference/cli.md for: " + ", ".join(missing)


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md is the front door: guides and figures belong in docs/"
    first_screen = "\n".join(text.splitlines()[:60])
    assert "```python" in first_screen and "import kline_store" in first_screen
