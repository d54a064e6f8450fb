"""The weights directory, used only through its descriptor: reached from / through root's links
only, owned by root and writable by no one else (made so when missing), and every file below it
looked at, hashed, opened or removed relative to that descriptor and the directories under it,
each opened without following a link.  A user who can rename a directory above it (one made
with `sudo mkdir` in their home) cannot redirect anything root does there.
"""
import os
import stat

from specops.agent import safefs
from specops.agent.host import ActionError, sha256_fd


def safe_name(name):
    """A file name from a listing, refused unless it stays inside the directory."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise ActionError("refusing the file name %r from the source: it would leave the weights directory" % name)
    return name


def open_dest(dest, allowed):
    """The descriptor of the weights directory, made if missing (with any missing parent, root's
    0755): reached from / through root's links only, owned by root and writable by no one else,
    so nothing can be planted in it, or it swapped, while root writes there.  The caller closes it."""
    try:
        dfd = safefs.open_dir(dest, for_writing=False)[0]
    except safefs.Missing:
        safefs.make_dir(dest, 0o755, 0, 0, allowed=allowed, parents=True)
        dfd = safefs.open_dir(dest, for_writing=False)[0]
    st = os.fstat(dfd)
    if st.st_uid != 0 or st.st_mode & 0o022:
        os.close(dfd)
        raise ActionError("%s is owned by uid %d, mode %o; specops puts weights only in a directory that root "
                          "owns and only root can write (move it away to have it made)"
                          % (dest, st.st_uid, stat.S_IMODE(st.st_mode)))
    return dfd


def parent_at(dfd, name, create=False):
    """(fd of the directory that holds `name` below the weights directory `dfd`, base name); each
    directory on the way opened without following a link, root's alone (made so with `create`).
    (None, base) when one is missing."""
    parts = safe_name(name).split("/")
    fd = os.dup(dfd)
    try:
        for part in parts[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                sub = os.open(part, safefs.O_DIR, dir_fd=fd)
            except FileNotFoundError:
                os.close(fd)
                return None, parts[-1]
            except OSError as e:
                raise ActionError("%s: %s" % (name, e.strerror))
            os.close(fd)
            fd = sub
            st = os.fstat(fd)
            if st.st_uid != 0 or st.st_mode & 0o022:
                raise ActionError("%s: a directory on its way is owned by uid %d, mode %o; specops writes weights "
                                  "only below root's own" % (name, st.st_uid, stat.S_IMODE(st.st_mode)))
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


def lstat_at(dfd, name):
    """lstat of the regular file `name` below the directory `dfd`, else None."""
    fd, base = parent_at(dfd, name)
    if fd is None:
        return None
    try:
        st = safefs.lstat_in(fd, base)
    finally:
        os.close(fd)
    return st if st is not None and stat.S_ISREG(st.st_mode) else None


def hash_at(dfd, name):
    """The sha256 of the regular file `name` below `dfd` (never through a link; a FIFO cannot hang it)."""
    fd, base = parent_at(dfd, name)
    try:
        f = safefs.open_regular(fd, base, name, shared=False) if fd is not None else None
    finally:
        if fd is not None:
            os.close(fd)
    if f is None:
        raise ActionError("%s: no such file in the weights directory" % name)
    try:
        return sha256_fd(f)
    finally:
        os.close(f)


def unlink_at(dfd, name):
    fd, base = parent_at(dfd, name)
    if fd is not None:
        try:
            os.unlink(base, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)


def files(dfd):
    """(name under the directory, lstat) of each regular file below the directory `dfd`."""
    for root, _, files, rfd in os.fwalk(".", dir_fd=dfd):
        for f in files:
            st = os.stat(f, dir_fd=rfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                yield os.path.normpath(os.path.join(root, f)), st


def on_disk(dfd):
    """Bytes under the directory, the partial downloads included."""
    return sum(st.st_size for _, st in files(dfd))
