"""A text file the user gives specops to read (an inventory's files, `inv patch --edited`'s copy,
a prompt file) is UTF-8: one that cannot be read, or is not UTF-8 text (saved by an editor in
Latin-1, say), is a usage error naming the file and the line, never a UnicodeDecodeError."""
from __future__ import annotations

import codecs
from pathlib import Path

from .errors import UsageError


def decoded(data: bytes, where: str, bom: bool = False) -> str:
    """`data` (read from `where`) as text; UsageError naming the line of the first byte that is
    not UTF-8.  `bom`: a byte order mark at the start (an editor on Windows writes one) is dropped,
    before the lines are counted."""
    if bom:
        data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UsageError(f"{where} line {line}: not UTF-8 text") from None


def read(path: Path) -> str:
    """The text of the file at `path` (UsageError: see the module's docstring)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror})") from None
    return decoded(data, str(path))
