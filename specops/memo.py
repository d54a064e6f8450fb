"""What the controller keeps between runs: results that are a pure function of their inputs (a
patched file's lint, a rendered template, the agent's zip and its bytecode, a patched module's
bytecode), named by the sha256 of everything they depend on, so a run only pays for what is new.

The memo is as trusted as the user's own checkout of specops (its bytecode runs as root on the
hosts), so it is used only where no one else can write (owndir.py): $SPECOPS_MEMO, else
$XDG_CACHE_HOME/specops (default ~/.cache/specops), a 0700 directory of the user's own, every
directory above it the user's or root's, no link (one before a `..` too) and writable by no one
else, or sticky as /tmp (so nothing can be swapped under it between a check and a use); entries
are opened without following links or blocking, written whole (a new temporary file, never one
already at its name, fsync'd, renamed) and checked against the sha256 they carry, so a
torn or truncated one is computed again.  Anything else turns the memo off, never the run;
SPECOPS_NO_MEMO=1 turns it off too.  Entries unused for MAX_AGE go when a new one of their kind
is written.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import threading
import time
from pathlib import Path
from functools import lru_cache
from typing import Callable

from . import owndir

MAX_AGE = 30 * 86400
_LOCKS: dict = {}  # (kind, name) → the lock its first computation holds in this process
_LOCKS_LOCK = threading.Lock()


def directory() -> Path:
    if os.environ.get("SPECOPS_MEMO"):
        return Path(os.environ["SPECOPS_MEMO"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specops"


def key(*parts: bytes | str) -> str:
    """The sha256 naming an entry: every part length-prefixed, so no two lists of parts collide."""
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else p.encode("utf-8", "surrogatepass")
        h.update(b"%d:" % len(b))
        h.update(b)
    return h.hexdigest()


@lru_cache(maxsize=None)
def code_id(module_file: str, package: str, *more: str) -> str:
    """The code a kept result depends on: a module's own source and an installed package's
    __init__ (which names its version), and `more` (an interpreter's version).  A change to any
    is a new key."""
    origin = importlib.util.find_spec(package).origin
    return key(Path(module_file).read_bytes(), origin, Path(origin).read_bytes(), *more)


def _kind_dir(kind: str) -> Path | None:
    if os.environ.get("SPECOPS_NO_MEMO") == "1":
        return None
    try:
        top = directory().absolute()  # one path, `..` kept for the kernel, for the checks and every use
        if owndir.make(top, 0o700) or not _private(top):
            return None
        d = top / kind
        return None if owndir.make(d, 0o700) or not _private(d) else d
    except OSError:
        return None


def _private(path: Path) -> bool:
    st = os.lstat(path)
    return st.st_uid == os.geteuid() and not st.st_mode & 0o077


def get(kind: str, name: str) -> bytes | None:
    """The entry's data, or None: missing, not a regular file of the user's, or not what its
    sha256 says (torn by a crash, truncated)."""
    d = _kind_dir(kind)
    if d is None:
        return None
    try:
        fd = os.open(d / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
        digest, data = raw[:32], raw[32:]
        if hashlib.sha256(data).digest() != digest:
            return None
        if time.time() - st.st_mtime > 86400:
            os.utime(fd)  # in use: the pruning goes by this time
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def put(kind: str, name: str, data: bytes) -> None:
    d = _kind_dir(kind)
    if d is None:
        return
    try:
        owndir.write_whole(d / name, hashlib.sha256(data).digest() + data, 0o600)
        now = time.time()
        for old in os.scandir(d):
            if old.is_file(follow_symlinks=False) and now - old.stat(follow_symlinks=False).st_mtime > MAX_AGE:
                os.unlink(old.path)
    except OSError:
        pass


def cached(kind: str, name: str, compute: Callable[[], bytes]) -> bytes:
    """The entry `name` of `kind`, computed and kept when it is not there: once, when a run's
    hosts ask for it at the same time."""
    with _LOCKS_LOCK:
        lock = _LOCKS.setdefault((kind, name), threading.Lock())
    with lock:
        data = get(kind, name)
        if data is None:
            data = compute()
            put(kind, name, data)
        return data
