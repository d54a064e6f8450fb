"""A file the user names on the command line for a run to write at its end: --json, `inv report
--out`, --fetch-sample.  Its path is checked before any connection, so that a typo is one line
and exit 2 before a host changes, not a traceback once the run is over; and a write that fails
all the same (the disk full, the directory taken away meanwhile) is one line too."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from . import owndir
from .errors import SpecopsError, UsageError


def check(path: str, option: str) -> None:
    """UsageError unless a file can be made at `path`: a directory that is there and writable,
    and no directory at `path` itself."""
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: a directory: give the path of a file to write")
    parent = os.path.dirname(path) or "."
    try:
        is_dir = stat.S_ISDIR(os.stat(parent).st_mode)
    except OSError as e:
        raise UsageError(f"{option} {path}: {parent}: {e.strerror}") from None
    if not is_dir:
        raise UsageError(f"{option} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: no file can be made in {parent} (Permission denied)")


def write(path: str, data: bytes, option: str) -> None:
    """`data` in `path`, whole, never through a link at the name (owndir.write_whole); a failure
    is a SpecopsError naming the option and the path."""
    try:
        owndir.write_whole(Path(path), data, 0o644)
    except OSError as e:
        raise SpecopsError(f"{option} {path}: not written ({e.strerror or e})") from None
