"""What the controller keeps between runs: results that are a pure function of their inputs (a
patched file's lint, a rendered template, the agent's zip), named by the sha256 of everything
they depend on, so a run only pays for what is new to it.

Kept in $SPECOPS_MEMO, else $XDG_CACHE_HOME/specops (default ~/.cache/specops): a directory only its owner can use,
files written whole (a temporary file renamed) and opened without following links.  Anything
missing, unreadable or not the owner's is computed again; a directory that is not safe to use
turns the memo off, never the run.  SPECOPS_NO_MEMO=1 turns it off too.  Entries unused for
MAX_AGE are removed when a new one of their kind is written.
"""
from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from pathlib import Path
from typing import Callable

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


def _own_dir(path: Path) -> bool:
    """Made if missing (0700); usable only when it is a directory, not a link, and only ours."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _kind_dir(kind: str) -> Path | None:
    if os.environ.get("SPECOPS_NO_MEMO") == "1":
        return None
    top = directory()
    return top / kind if _own_dir(top) and _own_dir(top / kind) else None


def get(kind: str, name: str) -> bytes | None:
    d = _kind_dir(kind)
    if d is None:
        return None
    try:
        fd = os.open(d / name, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
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
    tmp = d / f".{name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(tmp, d / name)
        now = time.time()
        for old in os.scandir(d):
            if old.is_file(follow_symlinks=False) and now - old.stat(follow_symlinks=False).st_mtime > MAX_AGE:
                os.unlink(old.path)
    except OSError:
        try:
            os.unlink(tmp)
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
