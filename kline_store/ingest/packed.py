"""Compressed inputs read directly: ``.csv.gz``, ``.csv.zst``, a ``.zip`` or a ``.tar.gz``/``.tgz`` holding one
CSV (vendors ship minute bars zipped). Told by their first bytes, so a gzip file named ``.csv`` is read too.
JSON records of bars (``[{"date": ..., "open": ...}, ...]``) and NDJSON (one record a line) are read by polars
and handed on as CSV text, so they get every check of a CSV (a message names "record N" of a JSON array).

The file is decompressed into memory once and handed to readers.py as UTF-8 bytes (GBK/GB18030 text is
re-encoded, as for a plain CSV), so every check of a CSV applies and messages name the compressed file's lines.
Decompression streams, a block at a time, up to a share of the memory available (memory.py: the machine's or the
cgroup's limit): a file whose stated size (a zip's or tar's directory, a gzip's trailer) is larger is refused up
front, and one that grows past it while decompressing (a gzip bomb: 7.8 MB holding 3 GiB) is refused there, in
one line naming the file and both sizes; never an OOM kill.
"""

from __future__ import annotations

import gzip
import os
import tarfile
import zipfile
import zlib
from pathlib import Path

from .. import memory
from ..errors import InputError

SUFFIXES = (".csv.gz", ".txt.gz", ".tsv.gz", ".csv.zst", ".csv.zstd", ".txt.zst", ".zip", ".tar.gz", ".tgz")
JSON_SUFFIXES = (".json", ".ndjson", ".jsonl")
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"))
_TEXT = (".csv", ".txt", ".tsv")
SHARE = 4           # decompressed bytes may take a quarter of the memory available (their parse takes more)
BLOCK = 1 << 20     # bytes decompressed at a time


def budget() -> tuple[int, object]:
    """(the most bytes a decompressed input may take, the memory available it comes from)."""
    avail = memory.available()
    return avail.nbytes // SHARE, avail


def _too_big(path: Path, size: int, exact: bool, cap: tuple[int, object]) -> InputError:
    return InputError(f"{path}: decompresses to {'' if exact else 'more than '}{memory.gib(size)} from "
                      f"{memory.gib(_size(path))} compressed; a compressed input is read in memory, and this one would "
                      f"take more than {memory.gib(cap[0])} (a quarter of {cap[1]}): decompress it to a file on disk "
                      f"and pass that file")


def _size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _drain(fh, path: Path, cap: tuple[int, object]) -> bytes:
    """Read a decompressing stream a block at a time, refusing it once it passes the budget."""
    out = bytearray()
    while True:
        block = fh.read(BLOCK)
        if not block:
            return bytes(out)
        out += block
        if len(out) > cap[0]:
            raise _too_big(path, len(out), False, cap)


def _stated(path: Path, size: int, cap: tuple[int, object]) -> None:
    """A size the archive states (zip, tar, a gzip trailer): refused up front when over the budget."""
    if size > cap[0]:
        raise _too_big(path, size, True, cap)


def _gzip_trailer(path: Path) -> int:
    """A gzip file's stated size (its last 4 bytes: the size modulo 4 GiB, of the last member): a hint only."""
    try:
        with open(path, "rb") as fh:
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0


def kind(path: Path) -> str | None:
    """"gzip", "zstd" or "zip" for a compressed file, else None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return None
    return next((k for magic, k in _MAGIC if head.startswith(magic)), None)


def unpack(path: Path, how: str) -> bytes:
    """The decompressed bytes of ``path``; InputError naming the file when it is damaged or not one CSV."""
    cap = budget()   # once: the memory available shrinks as the bytes come
    try:
        if how == "gzip" and _is_tar(path):
            return _one_from_tar(path, cap)
        if how == "gzip":
            _stated(path, _gzip_trailer(path), cap)
            with gzip.open(path, "rb") as fh:
                return _drain(fh, path, cap)
        if how == "zstd":
            import pyarrow as pa   # a dependency already; its zstd codec saves one for us
            with pa.input_stream(str(path), compression="zstd") as fh:
                return _drain(fh, path, cap)
        with zipfile.ZipFile(path) as z:
            names = [i.filename for i in z.infolist() if not i.is_dir() and not i.filename.startswith("__MACOSX/")]
            text = z.getinfo(_the_one_text(path, "zip", names, "unzip"))
            _stated(path, text.file_size, cap)
            with z.open(text) as fh:
                return _drain(fh, path, cap)
    except InputError:
        raise
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile, ValueError, RuntimeError) as exc:
        raise InputError(f"{path}: cannot decompress ({how}): {' '.join(str(exc).split())[:200]}") from None
    except Exception as exc:   # pyarrow's errors
        raise InputError(f"{path}: cannot decompress ({how}): {' '.join(str(exc).split())[:200]}") from None


def _the_one_text(path: Path, kind: str, names: list[str], unpack: str) -> str:
    """The name of the one CSV file an archive holds (InputError naming what it holds otherwise)."""
    if len(names) != 1 or not names[0].lower().endswith(_TEXT):
        shown = ", ".join(names[:5]) or "nothing"
        raise InputError(f"{path}: a {kind} archive is read when it holds one CSV file; it holds {shown}"
                         f"{' ...' if len(names) > 5 else ''} ({unpack} it and pass the files)")
    return names[0]


def _is_tar(path: Path) -> bool:
    """A gzip file holding a tar archive (``.tar.gz``, ``.tgz``): its name says so, or "ustar" at offset 257."""
    if path.name.lower().endswith((".tar.gz", ".tgz")):
        return True
    with gzip.open(path, "rb") as fh:
        head = fh.read(512)
    return head[257:262] == b"ustar"


def _one_from_tar(path: Path, cap: tuple[int, object]) -> bytes:
    """The one CSV inside a gzipped tar archive, as a zip's (InputError naming what it holds otherwise)."""
    with tarfile.open(path, "r:gz") as t:
        names = [m.name for m in t.getmembers() if m.isfile() and not Path(m.name).name.startswith("._")
                 and not m.name.startswith("__MACOSX/")]
        text = t.getmember(_the_one_text(path, "tar", names, "unpack"))
        _stated(path, text.size, cap)
        fh = t.extractfile(text)
        assert fh is not None
        return _drain(fh, path, cap)


def is_json(path: Path) -> bool:
    return path.name.lower().endswith(JSON_SUFFIXES)


def json_as_csv(path: Path) -> tuple[str, bytes]:
    """JSON records of bars, or NDJSON, as CSV text (values as written: polars' shortest round-trip floats), and
    what was read besides the values ("" or how a date field of epoch numbers was read)."""
    import polars as pl

    from . import columns

    lines = path.name.lower().endswith((".ndjson", ".jsonl"))
    cap = budget()
    if _size(path) > cap[0]:   # read whole, parsed and written again as text: several times its size in memory
        raise InputError(f"{path}: JSON of {memory.gib(_size(path))}; JSON records are read in memory, and this file "
                         f"would take more than {memory.gib(cap[0])} (a quarter of {cap[1]}): convert it to CSV or "
                         f"Parquet first")
    try:
        df = pl.read_ndjson(path) if lines else pl.read_json(path)
    except Exception as exc:   # polars' parse errors name the byte, not the record
        form = "one JSON record of a bar per line" if lines else 'a JSON array of records ([{"date": ..., ...}])'
        raise InputError(f"{path}: cannot read as {form} ({' '.join(str(exc).split())[:160]})") from None
    nested = [c for c, t in df.schema.items() if t.is_nested()]
    if nested or not df.width:
        raise InputError(f"{path}: expected records of bars, one value per field ({{\"date\": ..., \"close\": ..."
                         f"}}); {'fields ' + ', '.join(nested[:4]) + ' hold lists or objects' if nested else 'no field'}"
                         f" (flatten them first)")
    if not df.height:
        raise InputError(f"{path}: file is empty (no record)")
    said = ""
    for name, dt in df.schema.items():
        # pandas' to_json writes datetimes as epoch milliseconds: 13 digits, never a YYYYMMDD[HHMM[SS]] number
        if (dt.is_integer() and columns.ALIASES.get(columns.normalise(name)) == "date"
                and df[name].null_count() < df.height):
            lo, hi = df[name].min(), df[name].max()
            if 10**12 <= lo and hi < 10**13:   # type: ignore[operator]
                df = df.with_columns(pl.from_epoch(pl.col(name), time_unit="ms").dt.strftime("%Y-%m-%d %H:%M:%S"))
                said = f"; field {name!r}: epoch milliseconds (pandas' to_json) read as UTC stamps"
    return said, df.write_csv().encode()


def as_utf8(raw: bytes, path: Path) -> tuple[str, bytes]:
    """(encoding, UTF-8 bytes) of decompressed text: UTF-8 as it is, else GB18030 re-encoded."""
    if raw.startswith(b"\xff\xfe") or raw.startswith(b"\xfe\xff"):
        raise InputError(f"{path}: UTF-16 text inside; save it as UTF-8")
    try:
        raw.decode("utf-8")
        return ("utf-8-sig" if raw.startswith(b"\xef\xbb\xbf") else "utf-8"), raw
    except UnicodeDecodeError:
        pass
    try:
        return "gb18030", raw.decode("gb18030").encode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}: line {line}: neither UTF-8 nor GBK/GB18030 text (byte {exc.start})") from None


def read(path: Path) -> tuple[str, bytes] | None:
    """(encoding, UTF-8 bytes) of a compressed CSV (or JSON records as CSV), or None for a plain file."""
    if is_json(path):
        said, data = json_as_csv(path)
        return "json" + said, data
    how = kind(path)
    if how is None:
        return None
    enc, data = as_utf8(unpack(path, how), path)
    if not data.strip():
        raise InputError(f"{path}: file is empty (once decompressed)")
    return f"{how}, {enc}", data


