"""A managed module's bytecode: every .pyc of it removed whenever its source is replaced, and
the one compiled while validating the new source put in its place.

The validator of a patched module (roles.model_patches.COMPILE, run by the service's own
interpreter) prints what it compiled (layout.BYTECODE_LINE), a checked-hash .pyc (PEP 552):
the interpreter compares it with the hash of the source on every import, so it can never run
for other source, whatever the file's size and mtime.  The validator writes nothing: it runs
as root on a path, and only the agent writes, through descriptors it opened without following
links.  Installing it spares the service compiling the module again on start (for a service
whose user cannot write __pycache__, every process of every start compiled it).  `purge`
removes every .pyc of the module, then installs it, into a __pycache__ only root can write in.
"""
import base64
import json
import os
import time

from specops.agent import safefs
from specops.agent.host import ActionError, update_state
from specops.layout import BYTECODE_LINE, CHECKED_HASH, PYCACHE, is_bytecode_of


def compiled(stdout):
    """staged path → (sha256 of the source the validator read, .pyc name, .pyc bytes), from its
    stdout; lines that do not parse are not bytecode."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith(BYTECODE_LINE):
            try:
                path, digest, name, data = json.loads(line[len(BYTECODE_LINE):])
                found[path] = (digest, name, base64.b64decode(data))
            except (ValueError, TypeError):
                continue
    return found


def usable(name, module, data):
    """Checked-hash bytecode of `module`, under a name the interpreter looks for."""
    return (is_bytecode_of(name, module) and "/" not in name and len(data) > 16
            and data[4:8] == CHECKED_HASH)


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
        purged_at, installed = time.time(), []
        if prepared and prepared[0] == a.sha256 and prepared[1]:
            into = _root_only_cache(d)
            try:
                for name, data in prepared[1] if into is not None else []:
                    # The purge is recorded no later than the bytecode it installs (the filesystem's
                    # clock is coarser than time.time()): that .pyc is not older than the purge.
                    purged_at = min(purged_at, _install(into, name, data))
                    installed.append(name)
            finally:
                if into is not None:
                    os.close(into)
    finally:
        if cache is not None:
            os.close(cache)

    def note(state):
        state.setdefault("purges", {})[a.path] = {"sha256": a.sha256, "purged_at": purged_at, "removed": removed,
                                                  "compiled": installed}
    update_state(note)
    return removed


def _open_cache(directory, allowed):
    try:
        return safefs.open_dir(os.path.join(directory, PYCACHE), allowed)[0]
    except safefs.Missing:
        return None


def _root_only_cache(directory):
    """The module directory's __pycache__ when only root can write in it (created if missing,
    only in a module directory only root can write in).  allow_shared_dirs does not reach here:
    a __pycache__ someone else could write in gets no bytecode, and the service compiles."""
    path = os.path.join(directory, PYCACHE)
    try:
        try:
            return safefs.open_dir(path)[0]
        except safefs.Missing:
            safefs.make_dir(path, 0o755, 0, 0)
            return safefs.open_dir(path)[0]
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
    try:
        os.rename(tmp, name, src_dir_fd=cache, dst_dir_fd=cache)
    except OSError:
        os.unlink(tmp, dir_fd=cache)
        raise
    return mtime
