"""A managed module's bytecode: every .pyc of it removed whenever its source is replaced, and
the one compiled while validating the new source put in its place.

The validator of a patched module (roles.model_patches.COMPILE, run by the service's own
interpreter) leaves what it compiled in the stage directory's __pycache__, as a checked-hash
.pyc (PEP 552): the interpreter compares it with the hash of the source on every import, so it
can never run for other source, whatever the file's size and mtime.  Installing it spares the
service compiling the module again on start (for a service whose user cannot write
__pycache__, every process of every start compiled it).  `take` collects it before the source
is committed; `purge` removes every .pyc of the module, then installs it.
"""
import os
import stat
import time

from specops.agent import safefs
from specops.agent.host import ActionError, update_state
from specops.layout import is_bytecode_of

CACHE = "__pycache__"
CHECKED_HASH = 3  # PEP 552's flags: hash-based, checked against the source


def take(stage, module=None):
    """[(name, bytes)] of the checked-hash bytecode of `module` a validator left in a stage
    directory (safefs.StageDir); everything in its __pycache__ is removed, so the stage can go."""
    found = []
    try:
        fd = os.open(CACHE, safefs.O_DIR, dir_fd=stage.fd)
    except OSError:
        return found
    try:
        for name in os.listdir(fd):
            data = _read(fd, name)
            os.unlink(name, dir_fd=fd)
            if module and data and is_bytecode_of(name, module) and _checked(data):
                found.append((name, data))
    finally:
        os.close(fd)
    try:
        os.rmdir(CACHE, dir_fd=stage.fd)
    except OSError:
        pass
    return found


def _read(dfd, name):
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read() if stat.S_ISREG(os.fstat(fd).st_mode) else None


def _checked(data):
    return len(data) > 16 and int.from_bytes(data[4:8], "little") == CHECKED_HASH


def purge(a, allowed=(), prepared=None):
    """Answer a protocol.Purge: remove every cached bytecode of the module, check none is left,
    put back `prepared` (sha256 of the source it was compiled from, [(name, bytes)]) when it
    was compiled from the content now in place, and record when."""
    d, base = os.path.split(a.path)
    mod, removed = base[:-3], []
    cache = _open_cache(d, allowed)
    try:
        if cache is not None:
            for n in os.listdir(cache):
                if is_bytecode_of(n, mod):
                    os.unlink(n, dir_fd=cache)
                    removed.append(n)
            left = [n for n in os.listdir(cache) if is_bytecode_of(n, mod)]
            if left:
                raise ActionError("bytecode for %s still present after purge: %s" % (a.path, left))
        purged_at, compiled = time.time(), []
        if prepared and prepared[0] == a.sha256:
            cache = _make_cache(d, allowed) if cache is None else cache
            for name, data in prepared[1] if cache is not None else []:
                # The purge is recorded no later than the bytecode it installs (the filesystem's
                # clock is coarser than time.time()): that .pyc is not older than the purge.
                purged_at = min(purged_at, _install(cache, name, data))
                compiled.append(name)
    finally:
        if cache is not None:
            os.close(cache)

    def note(state):
        state.setdefault("purges", {})[a.path] = {"sha256": a.sha256, "purged_at": purged_at, "removed": removed,
                                                  "compiled": compiled}
    update_state(note)
    return removed


def _open_cache(directory, allowed):
    try:
        return safefs.open_dir(os.path.join(directory, CACHE), allowed)[0]
    except safefs.Missing:
        return None


def _make_cache(directory, allowed):
    """The module directory's __pycache__, created root-only-writable; None when it cannot be
    (a directory someone else could write in gets no bytecode: the service compiles)."""
    try:
        safefs.make_dir(os.path.join(directory, CACHE), 0o755, 0, 0, allowed)
        return safefs.open_dir(os.path.join(directory, CACHE), allowed)[0]
    except safefs.UnsafePath:
        return None


def _install(cache, name, data):
    """Write one .pyc (O_EXCL beside it, fsync'd, renamed: a torn .pyc would break the import);
    returns its mtime."""
    tmp = ".%s.%s" % (name, os.urandom(6).hex())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=cache)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, 0o644)
        os.fsync(fd)
        mtime = os.fstat(fd).st_mtime
    except OSError:
        os.close(fd)
        os.unlink(tmp, dir_fd=cache)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=cache, dst_dir_fd=cache)
    return mtime
