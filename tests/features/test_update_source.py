"""A derived store knows exactly what it was computed from (issue 26 part 1): the source's store id, version and
data-file checksums. `features --update` never appends onto cells of another source: a different store moved to
the path, the store deleted and ingested again, a data file rewritten in place, a link to another store are each
a full recompute, said so in one line, and the result equals a full computation cell for cell."""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import run_cli
from kline_store import append, compute_features, ingest, open_store, update_features
from kline_store.features.process import process_features
from kline_store.store import manifest as mf

EXPRS = {"MA5": "Mean($close, 5)/$close", "STD10": "Std($close, 10)", "CORR5": "Corr($close, Log($volume+1), 5)",
         "RESI5": "Resi($close, 5)/$close"}


def frames(seed: int, n_days: int, scale: float = 1.0) -> dict[str, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    days = np.busday_offset("2021-01-04", np.arange(n_days), roll="forward").astype(str)
    out = {}
    for s in range(4):
        close = scale * 10 * np.exp(np.cumsum(rng.normal(0, 0.02, n_days)))
        out[f"S{s}"] = pl.DataFrame({"date": days, "open": close, "high": close * 1.01, "low": close * 0.99,
                                     "close": close, "volume": rng.integers(1000, 9000, n_days).astype(float)})
    return out


def folder(path: Path, fr: dict[str, pl.DataFrame], first: int = 0, last: int | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for sym, df in fr.items():
        df[first:last].write_csv(path / f"{sym}.csv")
    return path


def panel(path: Path) -> np.ndarray:
    with open_store(path) as st:
        return np.array(st.panel)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def equals_full(feats: Path, base: Path, tmp: Path) -> bool:
    compute_features(base, tmp / "full", sets=[], exprs=EXPRS)
    return same(panel(feats), panel(tmp / "full"))


@pytest.fixture()
def computed(tmp_path) -> tuple[Path, Path]:
    """A bar store of 60 days and its features store."""
    base = tmp_path / "base"
    ingest([folder(tmp_path / "in", frames(1, 80), 0, 60)], base)
    compute_features(base, tmp_path / "feats", sets=[], exprs=EXPRS)
    return base, tmp_path / "feats"


def reissued(tmp: Path, dest: Path) -> Path:
    """A re-issued download ingested at ``dest``: other prices, 20 more days (generation 1, version 1)."""
    ingest([folder(tmp / "reissue", frames(2, 80, scale=1.3))], dest)
    return dest


def test_a_store_id_is_made_at_ingest_and_kept_across_appends_and_revisions(tmp_path):
    fr = frames(1, 80)
    base = tmp_path / "base"
    ingest([folder(tmp_path / "a", fr, 0, 60)], base)
    sid = open_store(base).manifest["store_id"]
    assert len(sid) == 32
    append(base, [folder(tmp_path / "b", fr, 60)])                                 # a tail append
    revised = {"S1": fr["S1"][:10].with_columns(pl.col("close") * 2)}
    append(base, [folder(tmp_path / "r", revised)])                                # a revision: a new generation
    with open_store(base) as st:
        assert st.manifest["store_id"] == sid and st.version == 3 and st.manifest["data"]["generation"] == 2
    shutil.rmtree(base)
    ingest([folder(tmp_path / "a", fr, 0, 60)], base)                              # the same files again
    assert open_store(base).manifest["store_id"] != sid


def test_a_tail_append_of_the_same_source_is_still_a_tail_update(computed, tmp_path):
    base, feats = computed
    append(base, [folder(tmp_path / "more", frames(1, 80), 60)])
    rep = update_features(feats)
    assert rep.mode == "tail" and rep.reason == ""
    assert equals_full(feats, base, tmp_path)


def test_the_source_deleted_and_ingested_again_is_a_full_recompute(computed, tmp_path):
    base, feats = computed
    shutil.rmtree(base)
    reissued(tmp_path, base)
    rep = update_features(feats)
    assert rep.mode == "full" and "another store" in rep.reason and "ingested again" in rep.reason
    assert equals_full(feats, base, tmp_path)


def test_another_store_moved_to_the_source_path_is_a_full_recompute(computed, tmp_path):
    base, feats = computed
    other = reissued(tmp_path, tmp_path / "other")
    shutil.rmtree(base)
    os.rename(other, base)
    rep = update_features(feats)
    assert rep.mode == "full" and "another store" in rep.reason
    assert equals_full(feats, base, tmp_path)


def test_a_link_to_another_store_at_the_source_path_is_a_full_recompute(computed, tmp_path):
    base, feats = computed
    other = reissued(tmp_path, tmp_path / "other")
    shutil.rmtree(base)
    base.symlink_to(other, target_is_directory=True)
    r = run_cli("features", str(feats), "--update")
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stdout.splitlines() + r.stderr.splitlines() if "full recompute" in line]
    assert len(notes) == 1 and "another store" in notes[0], r.stdout + r.stderr
    assert equals_full(feats, other, tmp_path)


def rewrite_in_place(store: Path, day: int, factor: float) -> None:
    """Scale one day's bars in the data file and reseal the manifest, version unchanged: a data file rewritten
    by another program (or a copy of another store's file) that `verify` would pass."""
    m = json.loads((store / "manifest.json").read_text())
    shape = m["shape"]
    raw = np.memmap(store / m["data"]["file"], dtype=np.float32, mode="r+",
                    shape=(m["data"]["rows"], shape["date_capacity"], shape["n_fields"]))
    raw[:, day] *= factor
    raw.flush()
    crcs = [zlib.crc32(np.ascontiguousarray(raw[r, : shape["n_dates"]]).data) for r in range(m["data"]["rows"])]
    del raw
    m["data"]["row_crc32"] = crcs
    m["data"]["checksum"] = mf.file_checksum(np.asarray(crcs, dtype=np.uint32))
    sealed = mf.seal({k: v for k, v in m.items() if k != mf.CHECKSUM_KEY})
    (store / "manifest.json").write_bytes(mf.encode(sealed))
    (store / "versions" / mf.version_file_name(m["version"])).write_bytes(mf.encode(sealed))


def test_a_data_file_rewritten_in_place_is_a_full_recompute(computed, tmp_path):
    base, feats = computed
    rewrite_in_place(base, 20, 1.5)
    rep = update_features(feats)
    assert rep.mode == "full" and "differs from the one this store was computed from" in rep.reason
    assert equals_full(feats, base, tmp_path)


def test_a_rewrite_followed_by_a_tail_append_is_a_full_recompute(computed, tmp_path):
    base, feats = computed
    rewrite_in_place(base, 20, 1.5)
    append(base, [folder(tmp_path / "more", frames(1, 80), 60)])                  # same id, same generation
    with open_store(base) as st:
        assert st.manifest["data"]["generation"] == 1 and st.version == 2
    rep = update_features(feats)
    assert rep.mode == "full" and "rewritten in place" in rep.reason and "S0" in rep.reason
    assert equals_full(feats, base, tmp_path)


def strip(store: Path, edit) -> None:
    m = json.loads((store / "manifest.json").read_text())
    edit(m)
    sealed = mf.seal({k: v for k, v in m.items() if k != mf.CHECKSUM_KEY})
    (store / "manifest.json").write_bytes(mf.encode(sealed))
    (store / "versions" / mf.version_file_name(m["version"])).write_bytes(mf.encode(sealed))


def test_a_source_written_before_store_ids_opens_and_updates_by_its_checksums(tmp_path):
    base = tmp_path / "base"
    ingest([folder(tmp_path / "in", frames(1, 80), 0, 60)], base)
    strip(base, lambda m: m.pop("store_id"))
    with open_store(base) as st:
        assert "store_id" not in st.manifest
    compute_features(base, tmp_path / "feats", sets=[], exprs=EXPRS)
    append(base, [folder(tmp_path / "more", frames(1, 80), 60)])                  # gets an id now
    assert len(open_store(base).manifest["store_id"]) == 32
    rep = update_features(tmp_path / "feats")
    assert rep.mode == "tail", rep.reason
    assert equals_full(tmp_path / "feats", base, tmp_path)


def test_a_features_store_without_its_sources_identity_recomputes_in_full(computed, tmp_path):
    base, feats = computed
    strip(feats, lambda m: m["features"]["source"].pop("row_crc32"))             # written by an older version
    append(base, [folder(tmp_path / "more", frames(1, 80), 60)])
    rep = update_features(feats)
    assert rep.mode == "full" and "older kline-store" in rep.reason
    assert equals_full(feats, base, tmp_path)
    append(base, [folder(tmp_path / "more2", {s: df.with_columns(pl.col("date").str.replace("2021", "2022"))
                                              for s, df in frames(3, 5).items()})])
    assert update_features(feats).mode == "tail"                                   # recorded again


def test_a_bad_store_id_is_refused_naming_the_key(computed):
    base, _ = computed
    strip(base, lambda m: m.update(store_id="../../etc"))
    r = run_cli("info", str(base))
    assert r.returncode == 1 and "store_id" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_derived_stores_record_their_sources_identity(computed, tmp_path):
    base, feats = computed
    with open_store(base) as b, open_store(feats) as f:
        src = f.manifest["features"]["source"]
        assert src["store_id"] == b.manifest["store_id"] and src["version"] == b.version
        assert src["checksum"] == b.manifest["data"]["checksum"] and len(src["row_crc32"]) == b.n_symbols
        assert f.manifest["sources"][0]["store_id"] == b.manifest["store_id"]
        assert f.manifest["store_id"] != b.manifest["store_id"]
    out = tmp_path / "proc"
    process_features(feats, out, fit_end="2021-02-26")
    with open_store(out) as p, open_store(feats) as f:
        assert p.manifest["features"]["processed_from"]["store_id"] == f.manifest["store_id"]
        assert p.manifest["features"]["processed_from"]["checksum"] == f.manifest["data"]["checksum"]
        assert p.manifest["sources"][0]["store_id"] == f.manifest["store_id"]


def test_a_resampled_store_records_its_sources_identity(computed, tmp_path):
    from kline_store.ingest.resample import resample
    base, _ = computed
    resample(base, tmp_path / "weekly", "1w")
    with open_store(base) as b, open_store(tmp_path / "weekly") as w:
        src = w.manifest["sources"][0]
        assert src["store_id"] == b.manifest["store_id"] and src["checksum"] == b.manifest["data"]["checksum"]
        assert src["version"] == b.version and w.manifest["store_id"] != b.manifest["store_id"]


@pytest.mark.parametrize("point", ["features:tail:grown", "features:tail:written", "commit:copied",
                                   "features:filled"])
def test_kill9_during_an_update_leaves_the_old_version_and_the_next_update_equals_a_full_one(computed, tmp_path,
                                                                                              point):
    import signal
    import subprocess
    import sys
    from kline_store.store.snapshot import verify_store
    base, feats = computed
    if point == "features:filled":                                    # a full recompute: the source re-created
        shutil.rmtree(base)
        reissued(tmp_path, base)
    else:
        append(base, [folder(tmp_path / "more", frames(1, 80), 60)])
    before = (feats / "manifest.json").read_bytes()
    r = subprocess.run([sys.executable, "-m", "kline_store.cli", "features", str(feats), "--update"],
                       capture_output=True, env=dict(os.environ, KLINE_STORE_CRASH_AT=point))
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (feats / "manifest.json").read_bytes() == before and verify_store(feats) == []
    rep = update_features(feats)
    assert rep.mode == ("full" if point == "features:filled" else "tail")
    assert equals_full(feats, base, tmp_path)


def test_info_json_shows_the_store_id(computed):
    base, _ = computed
    info = json.loads(run_cli("info", str(base), "--json").stdout)
    assert info["store_id"] == open_store(base).manifest["store_id"]


@pytest.mark.parametrize("damage", [lambda s: s.update(row_crc32=["x"] * len(s["row_crc32"])),
                                    lambda s: s.update(version="1"), lambda s: s.update(store_id=7)])
def test_a_damaged_record_of_the_source_recomputes_in_full(computed, tmp_path, damage):
    base, feats = computed
    strip(feats, lambda m: damage(m["features"]["source"]))
    append(base, [folder(tmp_path / "more", frames(1, 80), 60)])
    rep = update_features(feats)
    assert rep.mode == "full" and "damaged" in rep.reason
    assert equals_full(feats, base, tmp_path)
