"""Byte-level checks of a CSV text file, over the whole file: its encoding, and the field count of every line.

polars reads a line with fewer fields than the header as missing values, so a cut line would be stored
silently; it rejects a line with more fields only when it parses every column (a projection skips the
check), which readers.py does. Together with that, one count over the bytes settles the common case:

* fast path, numpy counts in 1 MiB blocks: when the file has no quote character and its separators number
  exactly ``(n_fields - 1) x lines``, no line can have fewer fields, since none has more (a fraction of the
  parse's cost);
* exact path, only for a file that fails the count or holds quotes: separators and line ends inside quoted
  fields are masked out, blank lines are allowed, and the first line with a wrong count is named.
"""

from __future__ import annotations

import codecs
import mmap
import os
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import InputError

BLOCK = 4 << 20          # bytes looked at per step: bounded memory whatever the file size
_NL, _CR, _QUOTE = 10, 13, 34
_BOM = b"\xef\xbb\xbf"
# Archives, compressed files and UTF-16 text users pass for a CSV (vendors ship zipped minute bars; Excel saves
# "Unicode text" as UTF-16): named by their first bytes, not reported as undecodable text.
_NOT_CSV_TEXT = (
    (b"PK\x03\x04", "a zip archive", "unzip it"),
    (b"\x1f\x8b", "gzip-compressed", "gunzip it"),
    (b"BZh", "bzip2-compressed", "bunzip2 it"),
    (b"\xfd7zXZ\x00", "xz-compressed", "unxz it"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive", "extract it"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "unzstd it"),
    (b"\xff\xfe", "UTF-16 text (Excel's 'Unicode text')", "save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 text", "save it as UTF-8"),
)


def map_file(path: Path) -> np.ndarray:
    """The file's bytes as a read-only uint8 array backed by a mapping (empty array for an empty file)."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)


def detect_encoding(path: Path) -> tuple[str, bytes | None]:
    """UTF-8 when the whole file decodes as such, else GB18030 (a superset of GBK).

    Read in blocks into one buffer (not mapped: a mapping of a big file would count whole in resident
    memory). An ASCII block is told apart by one comparison; only from the first other byte on is the text
    decoded. Returns the encoding and, for GB18030, the file re-encoded as UTF-8.
    """
    buf = bytearray(BLOCK)
    dec = None
    with open(path, "rb") as fh:
        n = fh.readinto(buf)
        for magic, what, undo in _NOT_CSV_TEXT:
            if bytes(buf[: len(magic)]) == magic:
                raise InputError(f"{path}: {what}, not CSV text readable here; {undo}")
        bom = bytes(buf[:3]) == _BOM
        start = 3 if bom else 0
        try:
            while n:
                view = memoryview(buf)[:n]
                if dec is not None:
                    dec.decode(view)
                elif np.frombuffer(view, dtype=np.uint8)[start:].max(initial=0) >= 128:
                    dec = codecs.getincrementaldecoder("utf-8")()
                    dec.decode(view[start:])
                start = 0
                n = fh.readinto(buf)
            if dec is not None:
                dec.decode(b"", final=True)
            return ("utf-8-sig" if bom else "utf-8"), None
        except UnicodeDecodeError:
            pass
    return "gb18030", gb18030(path)


def gb18030(path: Path) -> bytes:
    """The file, read as GB18030 (a superset of GBK), re-encoded as UTF-8; InputError when it is not that either."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("gb18030").encode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}: line {line}: neither UTF-8 nor GBK/GB18030 text (byte {exc.start})") from None


def sniff_encoding(path: Path) -> tuple[str, bytes | None, bool]:
    """(encoding, re-encoded bytes or None, settled) from the first block: all ASCII, the file is taken for UTF-8
    and, when it has more, not settled (:func:`scan` checks the rest, in the same pass as the field counts);
    otherwise the whole file is decided here (:func:`detect_encoding`)."""
    with open(path, "rb") as fh:
        head = fh.read(BLOCK)
        more = bool(fh.read(1))
    for magic, what, undo in _NOT_CSV_TEXT:
        if head[: len(magic)] == magic:
            raise InputError(f"{path}: {what}, not CSV text readable here; {undo}")
    bom = head[:3] == _BOM
    if np.frombuffer(head, dtype=np.uint8)[3 if bom else 0:].max(initial=0) < 128:
        return ("utf-8-sig" if bom else "utf-8"), None, not more
    enc, data = detect_encoding(path)
    return enc, data, True


def scan(path: Path, data: bytes | None, sep: str, n_fields: int, utf8: bool = False,
         stop: threading.Event | None = None, first_line: int = 1) -> bool:
    """The whole-file checks of a CSV in one pass, a block at a time: the field count of every line (as
    :func:`check_lines`, raising InputError at the first wrong one) and, with ``utf8``, that the text is UTF-8.

    A file is mapped and each block's pages dropped once counted: no copy, and resident memory stays one block.

    Args:
        path: the file (read unless ``data``, its bytes, is given).
        utf8: check the encoding too (a file whose first block was ASCII, see :func:`sniff_encoding`).
        stop: set by the caller when the result is no longer wanted.
        first_line: the file's own number of the text's first line (lines skipped before it, preamble.py).

    Returns:
        False when ``utf8`` and the text is not UTF-8 (the caller reads it as GB18030), else True.
    """
    mm = None
    if data is None:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return True
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        raw = data if data is not None else mm
        ok, quoted = _counts_agree(raw, mm, ord(sep), n_fields, utf8 and data is None, stop)
    finally:
        if mm is not None:
            try:
                mm.close()
            except BufferError:    # an exception's frames still see the array: the mapping goes with them
                pass
    if ok is None:
        return False
    if quoted or not ok:
        exact_lines(np.frombuffer(data, dtype=np.uint8) if data is not None else map_file(path), sep, n_fields, path,
                    first_line)
    return True


def _counts_agree(raw: bytes | mmap.mmap, mm: mmap.mmap | None, s: int, n_fields: int, utf8: bool,
                  stop: threading.Event | None) -> tuple[bool | None, bool]:
    """(True when the separators number ``(n_fields - 1) x lines`` (trailing blank lines aside; see
    :func:`count_lines`), False when not, None when ``utf8`` and the text is not UTF-8; whether it has a quote)."""
    b = np.frombuffer(raw, dtype=np.uint8)
    seps = newlines = trailing = 0     # trailing: line ends in the run of line-end bytes that ends the text
    quoted = False
    dec = None
    start = 3 if b[:3].tobytes() == _BOM else 0
    for lo in range(0, len(b), BLOCK):
        if stop is not None and stop.is_set():
            return True, quoted
        blk = b[lo: lo + BLOCK]
        quoted = quoted or raw.find(b'"', lo, lo + len(blk)) >= 0   # memchr; quotes make the counts meaningless
        if utf8:
            try:
                if dec is not None:
                    dec.decode(blk.data)
                elif blk[start:].max(initial=0) >= 128:
                    dec = codecs.getincrementaldecoder("utf-8")()
                    dec.decode(blk[start:].data)
            except UnicodeDecodeError:
                return None, quoted
            start = 0
        if not quoted:   # whole blocks: few calls, so few hand-overs of the GIL to and from the parsing thread
            seps += int(np.count_nonzero(blk == s))
            newlines += int(np.count_nonzero(blk == _NL))
        end = len(blk)
        while end and blk[end - 1] in (_NL, _CR):
            end -= 1
        tail = int(np.count_nonzero(blk[end:] == _NL))
        trailing = trailing + tail if end == 0 else tail
        if mm is not None:
            mm.madvise(mmap.MADV_DONTNEED, lo, len(blk))   # read-only: the pages stay in the page cache
    if dec is not None:
        try:
            dec.decode(b"", final=True)
        except UnicodeDecodeError:
            return None, quoted
    body = newlines - trailing       # line ends before the trailing blank lines (a spreadsheet's: no error)
    return len(b) <= trailing or seps == (n_fields - 1) * (body + 1), quoted


class Background:
    """A function run in a thread beside the parse (numpy and file reads release the GIL); :meth:`result`
    waits for it and returns its value or raises its exception."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.stop = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._value = fn(*args, stop=self.stop)
        except BaseException as exc:   # handed to the caller of result()
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self) -> None:
        self.stop.set()


def check_lines(buf: np.ndarray | bytes, sep: str, n_fields: int, path: Path, first_line: int = 1) -> int:
    """Raise InputError naming the first line with fewer fields than ``n_fields`` (or more, when the count
    alone cannot tell; polars' full parse rejects those otherwise).

    Args:
        buf: CSV bytes (a whole file, or a piece cut at a line end), as bytes or a uint8 array.
        sep: the field separator.
        n_fields: fields in the header.
        path: the file, for messages.
        first_line: line number of the first line in ``buf`` (the header is line 1).

    Returns:
        The number of lines in ``buf`` (blank lines included, as polars counts rows).
    """
    b = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, (bytes, bytearray, memoryview)) else buf
    counted = count_lines(b, sep, n_fields)
    if counted is not None:
        return counted
    return exact_lines(b, sep, n_fields, path, first_line)


def count_lines(b: np.ndarray, sep: str, n_fields: int, step: int = 1 << 20) -> int | None:
    """The number of lines when the totals agree (every line then has ``n_fields`` fields, see above);
    None when they do not, or when a quote makes them meaningless."""
    end = len(b)
    while end and b[end - 1] in (_NL, _CR):   # trailing blank lines (a spreadsheet's) are no bar, no error
        end -= 1
    if not end:
        return int(np.count_nonzero(b == _NL))
    s = ord(sep)
    seps = newlines = 0
    for lo in range(0, end, step):            # blocks that stay in cache: three passes cost one
        blk = b[lo: min(lo + step, end)]
        if np.count_nonzero(blk == _QUOTE):
            return None
        seps += int(np.count_nonzero(blk == s))
        newlines += int(np.count_nonzero(blk == _NL))
    if seps != (n_fields - 1) * (newlines + 1):
        return None
    # Lines as exact_lines counts them: each line end, and a last line without one.
    return newlines + int(np.count_nonzero(b[end:] == _NL)) + (0 if b[-1] == _NL else 1)


def exact_lines(b: np.ndarray, sep: str, n_fields: int, path: Path, first_line: int = 1) -> int:
    """Count the fields of every line, quote-aware, a block of whole lines at a time; raise at the first line
    whose count differs (blank lines are allowed). Returns the number of lines."""
    s, k, n = ord(sep), n_fields - 1, len(b)
    lo, line = 0, first_line
    while lo < n:
        hi = min(lo + BLOCK, n)
        while True:       # a window that ends with a whole line (a line longer than a block: widen)
            w = b[lo:hi]
            inside = _in_quotes(w)
            nl = np.flatnonzero(w == _NL)
            if inside is not None:
                nl = nl[~inside[nl]]
            if len(nl) or hi == n:
                break
            hi = min(hi + BLOCK, n)
        if hi == n and (not len(nl) or nl[-1] != len(w) - 1):
            ends, end = np.append(nl, len(w)), len(w)     # the last line has no line end
        else:
            ends, end = nl, int(nl[-1]) + 1
        _check_block(w[:end], ends, s, k, None if inside is None else inside[:end], path, line)
        line += len(ends)
        lo += end
    return line - first_line


def _in_quotes(b: np.ndarray) -> np.ndarray | None:
    """True for bytes inside a quoted field (the block starts outside quotes); None when there is no quote."""
    q = b == _QUOTE
    if not q.any():
        return None
    return np.bitwise_xor.accumulate(q.view(np.uint8)).view(bool)


def _check_block(seg: np.ndarray, ends: np.ndarray, s: int, k: int, inside: np.ndarray | None, path: Path,
                 line: int) -> None:
    """Count the separators of each line outside quotes; blank lines are allowed; raise at the first bad line."""
    is_sep = seg == s
    if inside is not None:
        is_sep &= ~inside
    sp = np.flatnonzero(is_sep)
    starts = np.empty(len(ends), dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    count = np.searchsorted(sp, ends) - np.searchsorted(sp, starts)
    length = ends - starts
    blank = (length == 0) | ((length == 1) & (seg[np.minimum(starts, len(seg) - 1)] == _CR))
    bad = ~blank & (count != k)
    if bad.any():
        i = int(np.argmax(bad))
        got = int(count[i]) + 1
        why = "a cut line?" if got < k + 1 else "an unquoted separator inside a value, such as a thousands separator?"
        rest = count[i:][~blank[i:]]
        if got > k + 1 and line + i == 2 and (rest == count[i]).all():   # every line: the header is what is short
            why = (f"every line has {got}: the header names fewer columns than the lines hold (a column without "
                   f"a name, or a separator at the end of each line?)")
        raise InputError(f"{path}: line {line + i}: {got} field{'s' if got != 1 else ''}, the header has "
                         f"{k + 1} ({why})")
