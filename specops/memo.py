"""What the controller keeps between runs: results that are a pure function of their inputs (a
patched file's lint, a rendered template, the agent's zip and its bytecode, a patched module's
bytecode), named by the sha256 of everything they depend on, so a run only pays for what is new.

The memo is as trusted as the user's own checkout of specops (its bytecode runs as root on the
hosts), so it is used only where no one else can write: $SPECOPS_MEMO, else
$XDG_CACHE_HOME/specops (default ~/.cache/specops), a 0700 directory of the user's own, every
directory above it the user's or root's and writable by no one else, or sticky as /tmp (so
nothing can be swapped under it between a check and a use), and none of them a link (each
component as the kernel reads the path, one before a `..` too); entries are opened without following links or blocking,
written whole (a temporary file, fsync'd, renamed) and checked against the sha256 they carry, so a
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


def _only_ours(st: os.stat_result) -> bool:
    # A sticky directory (/tmp) lets no one else rename or remove what is ours in it.
    return st.st_uid in (0, os.geteuid()) and (not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX))


def trusted(path: Path) -> bool:
    """Every directory from / down to `path` is a directory (not a link), root's or the user's, and
    writable by no one else (or sticky, as /tmp).  Each component as given, `..` too, as the kernel
    reads it: os.path.abspath would drop `x/..` as text where the kernel follows a link x first."""
    try:
        parts = Path(path).absolute().parts
    except OSError:  # the working directory is gone
        return False
    for i in range(1, len(parts) + 1):
        try:
            st = os.lstat(os.path.join(*parts[:i]))
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or not _only_ours(st):
            return False
    return True


def _kind_dir(kind: str) -> Path | None:
    if os.environ.get("SPECOPS_NO_MEMO") == "1":
        return None
    try:
        top = directory().absolute()  # one path, `..` kept for the kernel, for the checks and every use
        if not os.path.lexists(top):
            made = top.parent
            while not os.path.lexists(made):
                made = made.parent
            if not trusted(made):  # nothing made where someone else could have put a link
                return None
            top.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not (trusted(top) and _private(top)):
            return None
        d = top / kind
        if not os.path.lexists(d):
            d.mkdir(mode=0o700)
        return d if trusted(d) and _private(d) else None
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
    tmp = d / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(data).digest() + data)
            f.flush()
            os.fsync(f.fileno())
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
