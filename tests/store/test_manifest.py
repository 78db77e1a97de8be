"""The manifest is checked like the data: checksum over its content, schema check of every value.

Case 2 of issue 9: swapped symbols, a changed calendar date, swapped fields passed `verify` and opened into
wrong data; 201 of 300 random digit changes and 50 of 300 bit flips went unnoticed; crafted types gave raw
ValueError / TypeError / OverflowError. The fuzz test below mutates digits, bits, keys and types and shows
that no mutation opens into wrong data and every refusal is a StoreError.
"""

import copy
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from kline_store import StoreError, append, ingest, open_store, verify_store
from kline_store.store import manifest as mf


@pytest.fixture(scope="module")
def small_store(real, tmp_path_factory) -> Path:
    """3 real Yahoo symbols x 40 days (with Adj Close, so the manifest has rebase divisors too)."""
    d = tmp_path_factory.mktemp("m")
    for sym in ("AAPL", "PTR", "REX"):
        lines = (real / "us_yahoo_daily" / f"{sym}.csv").read_text().splitlines()[:41]
        (d / "in").mkdir(exist_ok=True)
        (d / "in" / f"{sym}.csv").write_text("\n".join(lines) + "\n")
    ingest([d / "in"], d / "s")
    return d / "s"


def snapshot(path: Path) -> tuple:
    with open_store(path, verify=True) as st:
        return (st.version, st.symbols, st.fields, st.dates.tolist(), st.first_bar.tolist(), st.last_bar.tolist(),
                np.asarray(st.panel).tobytes())


def manifest_of(store: Path) -> dict:
    return json.loads((store / "manifest.json").read_text())


def put(store: Path, m: dict | bytes) -> None:
    raw = m if isinstance(m, bytes) else json.dumps(m, separators=(",", ":"), ensure_ascii=False).encode()
    (store / "manifest.json").write_bytes(raw)


@pytest.fixture
def store(small_store, tmp_path) -> Path:
    """A private copy of the small store (tests edit its manifest)."""
    shutil.copytree(small_store, tmp_path / "s")
    return tmp_path / "s"


def test_checksum_is_over_canonical_content(store):
    m = manifest_of(store)
    assert m["manifest_checksum"] == mf.content_checksum(m)
    reordered = dict(reversed(list(m.items())))
    assert mf.content_checksum(reordered) == m["manifest_checksum"]        # key order does not matter
    put(store, json.dumps(reordered, indent=2).encode())                   # nor whitespace
    assert open_store(store).n_symbols == 3 and verify_store(store) == []


@pytest.mark.parametrize("edit", ["swap_symbols", "change_date", "duplicate_date", "swap_fields"])
def test_edits_that_keep_the_schema_are_caught_by_the_checksum(store, edit):
    """Case 2: each of these passed verify and opened into wrong data."""
    m = manifest_of(store)
    if edit == "swap_symbols":
        m["symbols"][0], m["symbols"][1] = m["symbols"][1], m["symbols"][0]
    elif edit == "change_date":
        m["calendar"][5] = m["calendar"][5][:-2] + "%02d" % (int(m["calendar"][5][-2:]) % 28 + 1)
    elif edit == "duplicate_date":
        m["calendar"][5] = m["calendar"][4]
    else:
        m["fields"][0], m["fields"][3] = m["fields"][3], m["fields"][0]
    put(store, m)
    with pytest.raises(StoreError, match=r"manifest\.json: manifest key '(manifest_checksum|calendar)'"):
        open_store(store)
    problems = verify_store(store)
    assert problems and "manifest.json" in problems[0]
    r = run_cli("verify", str(store))
    assert r.returncode == 1 and "manifest key" in r.stderr


# (key path, bad value, key named in the error): values a crafted or damaged manifest may hold
CRAFTED = [
    (("calendar", 3), "2016-06-79", "calendar"),
    (("calendar", 3), 20160607, "calendar"),
    (("calendar", 0), "0001-01-01", "calendar"),
    (("calendar",), "2016-06-07", "calendar"),
    (("version",), "1", "version"),
    (("version",), 0, "version"),
    (("version",), True, "version"),
    (("shape", "n_fields"), 7.0, "shape.n_fields"),
    (("shape", "n_symbols"), 2 ** 70, "shape.n_symbols"),
    (("shape", "n_dates"), -1, "shape.n_dates"),
    (("shape", "date_capacity"), 3, "shape.date_capacity"),
    (("shape",), [], "shape"),
    (("data", "row_crc32", 0), -1, "data.row_crc32"),
    (("data", "row_crc32", 0), 2 ** 32, "data.row_crc32"),
    (("data", "row_crc32"), None, "data.row_crc32"),
    (("data", "file"), None, "data.file"),
    (("data", "file"), "../victim.bin", "data.file"),
    (("data", "file"), "/etc/passwd", "data.file"),
    (("data", "file"), "data-g000002.f32", "data.file"),
    (("data", "rows"), 1, "data.rows"),
    (("data", "size"), 10, "data.size"),
    (("data", "checksum"), "crc32:00000000", "data.checksum"),
    (("data",), "data-g000001.f32", "data"),
    (("symbols", 1), None, "symbols"),
    (("symbols", 1), "AAPL", "symbols"),
    (("symbols",), "AAPL", "symbols"),
    (("fields", 2), "open", "fields"),
    (("fields", 2), "", "fields"),
    (("first_bar", 0), 41, "first_bar"),
    (("first_bar", 0), 1.5, "first_bar"),
    (("last_bar", 0), -1, "first_bar"),
    (("first_date", 0), "2012-09-05", "first_date"),
    (("n_bars",), -5, "n_bars"),
    (("dtype",), "float64", "dtype"),
    (("adj_rebase", 0), -1.0, "adj_rebase"),
    (("adj_rebase",), {"AAPL": 1}, "adj_rebase"),
    (("adj_factor_source",), "magic", "adj_factor_source"),
    (("sources",), "a.csv", "sources"),
]


def _set(m: dict, path: tuple, value) -> None:
    node = m
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


@pytest.mark.parametrize("path,value,key", CRAFTED, ids=[f"{'.'.join(map(str, p))}={v!r}"[:40] for p, v, _ in CRAFTED])
def test_crafted_values_are_store_errors_naming_the_key(store, path, value, key):
    """Schema check, on a manifest without the checksum (an older store, or one crafted to pass it)."""
    m = manifest_of(store)
    del m["manifest_checksum"]
    _set(m, path, value)
    put(store, m)
    with pytest.raises(StoreError, match=rf"{store / 'manifest.json'}: manifest key '{key}'"):
        open_store(store)
    assert "manifest key" in verify_store(store)[0]


def test_duplicate_keys_and_non_json_numbers_are_refused(store):
    text = (store / "manifest.json").read_text()
    put(store, ('{"symbols":["X","Y","Z"],' + text[1:]).encode())
    with pytest.raises(StoreError, match="key 'symbols' appears twice"):
        open_store(store)
    put(store, text.replace('"n_bars":', '"n_bars":NaN,"x":', 1).encode())
    with pytest.raises(StoreError, match="unreadable or corrupt"):
        open_store(store)


def test_a_store_without_checksum_opens_verify_says_so_and_the_next_write_adds_it(store, real):
    m = manifest_of(store)
    del m["manifest_checksum"]
    put(store, m)
    before = snapshot(store)
    r = run_cli("verify", str(store))
    assert r.returncode == 0 and "has no checksum" in r.stdout and "next write adds one" in r.stdout
    lines = (real / "us_yahoo_daily" / "AAPL.csv").read_text().splitlines()
    (store.parent / "new").mkdir()
    (store.parent / "new" / "AAPL.csv").write_text("\n".join(lines[:1] + lines[41:43]) + "\n")
    append(store, [store.parent / "new"])
    m2 = manifest_of(store)
    assert m2["manifest_checksum"] == mf.content_checksum(m2) and m2["version"] == before[0] + 1
    assert "has no checksum" not in run_cli("verify", str(store)).stdout


def _key_paths(node, prefix=()):
    """Every path to a dict key or list entry in a manifest."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _key_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield prefix + (i,)
            yield from _key_paths(v, prefix + (i,))


OTHER_VALUES = ["1", 1, 1.0, 0, -1, None, True, [], {}, "x", 2 ** 64, 1e308, "2016-06-79", "../victim.bin"]


def _mutants(raw: bytes, rng: random.Random, n: int):
    """(kind, bytes) mutants of a manifest: single digits, single bits, key deletions and renames, values
    replaced by values of other types."""
    digits = [i for i, b in enumerate(raw) if 48 <= b <= 57]
    for _ in range(n):
        i = rng.choice(digits)
        yield "digit", raw[:i] + bytes([rng.choice([d for d in b"0123456789" if d != raw[i]])]) + raw[i + 1:]
    for _ in range(n):
        i = rng.randrange(len(raw))
        yield "bit", raw[:i] + bytes([raw[i] ^ (1 << rng.randrange(8))]) + raw[i + 1:]
    m = json.loads(raw)
    paths = list(_key_paths(m))
    for path in rng.sample(paths, min(n, len(paths))):
        for op in ("delete", "rename", "type"):
            mm = copy.deepcopy(m)
            parent = mm
            for k in path[:-1]:
                parent = parent[k]
            if op == "type":
                parent[path[-1]] = rng.choice([v for v in OTHER_VALUES if v != parent[path[-1]]])
            elif isinstance(parent, dict) and op == "delete":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[f"{path[-1]}_"] = parent.pop(path[-1])
            elif op == "delete":
                del parent[path[-1]]
            else:
                parent.insert(path[-1], copy.deepcopy(parent[path[-1]]))
            yield op, json.dumps(mm, separators=(",", ":"), ensure_ascii=False).encode()


def test_fuzzed_manifests_never_open_into_wrong_data(store):
    """Digits, bits, keys, types: each mutant is refused with a StoreError or opens into the same data."""
    want = snapshot(store)
    raw = (store / "manifest.json").read_bytes()
    seen = {"digit": [0, 0], "bit": [0, 0], "delete": [0, 0], "rename": [0, 0], "type": [0, 0]}
    for kind, mutant in _mutants(raw, random.Random(9), 300):
        put(store, mutant)
        try:
            got = snapshot(store)
        except StoreError:
            seen[kind][0] += 1
            continue
        seen[kind][1] += 1
        assert got == want, (kind, mutant[:200])
        # The only mutants that open changed the checksum's own key (the store then reads as one written
        # before checksums, its content unchanged) or spelled the same content (1e-05 as 1E-05).
        parsed = json.loads(mutant)
        assert mf.CHECKSUM_KEY not in parsed or mf.content_checksum(parsed) == parsed[mf.CHECKSUM_KEY], kind
    put(store, raw)
    assert snapshot(store) == want
    assert all(refused > 0 for refused, _ in seen.values()), seen
    assert sum(ok for _, ok in seen.values()) < 0.02 * sum(sum(v) for v in seen.values()), seen


def test_fuzzed_manifests_without_checksum_fail_as_store_errors_only(store):
    """Without the checksum a mutant may open (a swapped digit in a price's CRC is caught, a changed name is
    not), but no mutant raises anything but a StoreError."""
    m = manifest_of(store)
    del m["manifest_checksum"]
    raw = json.dumps(m, separators=(",", ":"), ensure_ascii=False).encode()
    for kind, mutant in _mutants(raw, random.Random(10), 150):
        put(store, mutant)
        try:
            open_store(store, verify=True).close()
        except StoreError:
            pass


def test_versions_newer_than_the_current_or_behind_a_link_are_not_snapshots(store, tmp_path):
    with pytest.raises(StoreError, match="version 2 is not available"):
        open_store(store, version=2)
    shutil.move(store / "versions", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", store / "versions")
    assert open_store(store).version == 1          # the current version opens (its copy is simply not pinned)
    m = manifest_of(store)
    m["version"] = 2
    put(store, mf.seal(m))                          # version 1 can now only come from versions/: a link
    with pytest.raises(StoreError, match="versions: is a symbolic link"):
        open_store(store, version=1)
