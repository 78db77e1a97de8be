"""Which store a derived store was computed from, exactly: its store id, version, data file and checksums.

A store id is a random 128-bit name made when a store is first written (an ingest, a Qlib import, a features
or processed store) and kept by every later write of that store (appends, revisions, universes; see
writer.commit). A store deleted and ingested again at the same path gets a new one, so its generation
numbers starting over cannot pass for the old store's. Stores written before ids existed have none and still
open.

A derived store records its source's identity (``record``) and, before it appends onto cells it computed,
checks that the source at that path is still that store, extended only by tail appends (``change``): the
same id, the same data file generation, and every row's bytes that the derived store read still the same,
which the row checksums say without reading them again (a tail append extends each row's CRC-32 from the
recorded one; ``crc32(new days, recorded) == current`` holds exactly when the recorded prefix is unchanged).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from . import manifest as mf
from ..errors import StoreError
from .manifest import STORE_ID_KEY as KEY, new_store_id
from .snapshot import Store


def store_id(m: dict) -> str | None:
    """The manifest's store id (None for a store written before ids existed)."""
    return m.get(KEY)


def current_id(store_dir: Path) -> str | None:
    """The id of the store at ``store_dir`` (None when there is none, it is damaged or has no id yet)."""
    try:
        return store_id(mf.read_manifest(store_dir))
    except StoreError:
        return None


def record(st: Store) -> dict:
    """What a derived store keeps of its source: enough for ``change`` to tell it from any other store."""
    data = st.manifest["data"]
    return {"path": str(st.path.resolve()), KEY: store_id(st.manifest), "version": st.version,
            "generation": int(data["generation"]), "file": data["file"], "n_symbols": st.n_symbols,
            "n_dates": st.n_dates, "n_fields": st.n_fields, "checksum": data["checksum"],
            "row_crc32": [int(c) for c in data["row_crc32"][: st.n_symbols]]}


def summary(st: Store) -> dict:
    """A derived store's ``sources`` entry for ``st``: path, store id, version, data file and its checksum."""
    return {"path": str(st.path), KEY: store_id(st.manifest), "version": st.version,
            "generation": int(st.manifest["data"]["generation"]), "checksum": st.manifest["data"]["checksum"]}


def _short(sid) -> str:
    return str(sid)[:12] if sid else "none (written before store ids)"


def change(rec: dict, st: Store) -> str:
    """Why ``st`` is not the store ``rec`` describes, extended by tail appends only ('' when it is): a one-line
    reason naming the difference. Reads only the days appended since (to extend the recorded checksums)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("row_crc32"), list) or "checksum" not in rec:
        return "this store does not record its source's identity (written by an older kline-store)"
    if not all(type(rec.get(k)) is int for k in ("version", "generation", "n_symbols", "n_dates", "n_fields")) \
            or not all(type(c) is int and 0 <= c < 1 << 32 for c in rec["row_crc32"]) \
            or not (rec.get(KEY) is None or isinstance(rec.get(KEY), str)):
        return "this store's record of its source is damaged (its manifest's source entry)"
    was, now = rec.get(KEY), store_id(st.manifest)
    if was is not None and was != now:
        return (f"{st.path} is another store than the one this store was computed from (store id {_short(now)}, "
                f"recorded {_short(was)}): deleted and ingested again, replaced, or a link to another store")
    if st.version < rec["version"]:
        return (f"{st.path} is at version {st.version}, before version {rec.get('version')} this store was "
                "computed from (re-created or restored from a copy)")
    if st.manifest["data"]["generation"] != rec.get("generation") or st.n_fields != rec.get("n_fields"):
        return "the source store was rewritten since (a revision, an insertion or new fields)"
    n_old, t_old = rec.get("n_symbols"), rec.get("n_dates")
    crcs = np.asarray(st.manifest["data"]["row_crc32"], dtype=np.int64)
    if type(n_old) is not int or type(t_old) is not int or not 0 <= n_old <= min(st.n_symbols, len(crcs)) \
            or not 0 <= t_old <= st.n_dates or len(rec["row_crc32"]) != n_old:
        return "the source store's symbols or calendar no longer extend this store's"
    if st.version == rec.get("version"):
        if st.manifest["data"]["checksum"] != rec["checksum"]:
            return (f"{st.path}'s data file {st.manifest['data']['file']} differs from the one this store was "
                    f"computed from at version {st.version} (checksum {st.manifest['data']['checksum']}, recorded "
                    f"{rec['checksum']})")
        return ""
    panel = st.panel
    for r in range(n_old):
        got = zlib.crc32(np.ascontiguousarray(panel[r, t_old:]).data, rec["row_crc32"][r])
        if got != int(crcs[r]):
            return (f"{st.path}: the bars of {st.symbols[r]} up to {st.dates[t_old - 1] if t_old else 'its start'}"
                    f" differ from those this store was computed from (its data file was rewritten in place)")
    return ""


__all__ = ["KEY", "change", "current_id", "new_store_id", "record", "store_id", "summary"]
