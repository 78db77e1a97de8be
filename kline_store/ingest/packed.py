"""Compressed inputs read directly: ``.csv.gz``, ``.csv.zst`` and a ``.zip`` holding one CSV (vendors ship
minute bars zipped). Told by their first bytes, so a gzip file named ``.csv`` is read too.

The file is decompressed into memory once and handed to readers.py as UTF-8 bytes (GBK/GB18030 text is
re-encoded, as for a plain CSV), so every check of a CSV applies and messages name the compressed file's lines.
"""

from __future__ import annotations

import gzip
import zipfile
import zlib
from pathlib import Path

from ..errors import InputError

SUFFIXES = (".csv.gz", ".txt.gz", ".tsv.gz", ".csv.zst", ".csv.zstd", ".txt.zst", ".zip")
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"))
_TEXT = (".csv", ".txt", ".tsv")


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
    try:
        if how == "gzip":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        if how == "zstd":
            import pyarrow as pa   # a dependency already; its zstd codec saves one for us
            with pa.input_stream(str(path), compression="zstd") as fh:
                return fh.read()
        with zipfile.ZipFile(path) as z:
            members = [i for i in z.infolist() if not i.is_dir() and not i.filename.startswith("__MACOSX/")]
            texts = [i for i in members if i.filename.lower().endswith(_TEXT)]
            if len(members) != 1 or len(texts) != 1:
                names = ", ".join(i.filename for i in members[:5]) or "nothing"
                raise InputError(f"{path}: a zip archive is read when it holds one CSV file; it holds {names}"
                                 f"{' ...' if len(members) > 5 else ''} (unzip it and pass the files)")
            return z.read(texts[0])
    except InputError:
        raise
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile, ValueError, RuntimeError) as exc:
        raise InputError(f"{path}: cannot decompress ({how}): {' '.join(str(exc).split())[:200]}") from None
    except Exception as exc:   # pyarrow's errors
        raise InputError(f"{path}: cannot decompress ({how}): {' '.join(str(exc).split())[:200]}") from None


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
    """(encoding, UTF-8 bytes) of a compressed CSV, or None for a file that is not compressed."""
    how = kind(path)
    if how is None:
        return None
    enc, data = as_utf8(unpack(path, how), path)
    if not data.strip():
        raise InputError(f"{path}: file is empty (once decompressed)")
    return f"{how}, {enc}", data


