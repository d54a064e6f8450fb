"""Directories on the controller that no one but the user and root can change, and files written
whole into them: the memo's (memo.py) and `inv monitoring --out`'s (fleetwide/prometheus.py);
`inv patch` writes its files whole the same way (flows/patching.py), where the user keeps them.

A path is checked as the kernel reads it, each component as given: a link anywhere on it is
refused, one before a `..` too (os.path.abspath drops `x/..` as text, where the kernel follows a
link x first).  Once checked, no one else can change what it names, so the same path is then used
to make, open and rename.
"""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path


def untrusted(path: str | Path, sticky: bool = True) -> str | None:
    """Why `path` is not a directory only the user and root can change, or None when it is: every
    directory from / down to it a directory (not a link), root's or the user's, and writable by no
    one else, or sticky as /tmp (no one else can rename or remove what is ours in it).
    sticky=False: `path` itself is writable by its owner alone, sticky or not (in a sticky one,
    anyone could take the names about to be written)."""
    try:
        parts = Path(path).absolute().parts
    except OSError as e:  # the working directory is gone
        return f"the working directory: {e.strerror}"
    for i in range(1, len(parts) + 1):
        at = os.path.join(*parts[:i])
        try:
            st = os.lstat(at)
        except OSError as e:
            return f"{at}: {e.strerror}"
        why = _why(at, st, sticky or i < len(parts))
        if why:
            return why
    return None


def _why(at: str, st: os.stat_result, sticky: bool) -> str | None:
    """Why the directory `at` (its lstat or fstat) is not one only the user and root can change."""
    if stat.S_ISLNK(st.st_mode):
        return f"{at} is a link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{at} is not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"{at} is another user's (uid {st.st_uid})"
    if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and sticky):
        return f"{at} is writable by others than its owner (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def make(path: Path, mode: int) -> str | None:
    """Make the directory `path` (and those missing above it) if it is missing, only below one
    `untrusted` passes, one component at a time from a descriptor of the one above (O_NOFOLLOW: a
    link someone puts at a missing name between the check and the mkdir is never followed, and
    a directory someone else made there first is refused); then why `path` itself is not one the
    user and root alone can change (sticky=False), or None.  OSError: mkdir's or open's."""
    if not os.path.lexists(path):
        above, missing = path.parent, [path.name]
        while not os.path.lexists(above):
            above, missing = above.parent, [above.name, *missing]
        why = untrusted(above)
        if why:
            return why
        fd = os.open(above, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for i, name in enumerate(missing):
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # made since we looked: whose it is, the fstat below says
                nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nfd
                why = _why(os.path.join(above, *missing[:i + 1]), os.fstat(fd), i < len(missing) - 1)
                if why:
                    return why
        finally:
            os.close(fd)
    return untrusted(path, sticky=False)


def write_whole(path: Path, data: bytes, mode: int) -> None:
    """`data` in `path`, whole or not at all: a new file beside it (O_EXCL|O_NOFOLLOW: whatever is
    already at that name, a link or a file, is never written through), fsync'd, renamed over the
    old.  A reader has the old file or the new, never half of one.  OSError: the open's, a write's."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)  # ours: the O_EXCL open made it
        except OSError:
            pass
        raise
