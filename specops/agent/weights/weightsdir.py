"""The weights directory, used only through its descriptor: reached from / through root's links
only, owned by root and writable by no one else (made so when missing), and every file below it
looked at, hashed, opened or removed relative to that descriptor and the directories under it,
each opened without following a link.  A user who can rename a directory above it (one made
with `sudo mkdir` in their home) cannot redirect anything root does there.
"""
import os
import stat

from specops.agent import safefs
from specops.agent.host import ActionError, sha256_fd, user_name

# A test hook, "PATH:SECONDS": open_dest waits that long between finding the weights directory
# PATH missing and making it, and says so in SLOW_MKDIR_MARK, widening the window a local user
# races in (tests/test_weights_fleet.py sets it in a sandbox host's /etc/environment; only root's
# own environment can).
SLOW_MKDIR = os.environ.get("SPECOPS_TEST_SLOW_MKDIR", "")
SLOW_MKDIR_MARK = "/run/specops-test-slow-mkdir"


def safe_name(name):
    """A file name from a listing, refused unless it stays inside the directory."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise ActionError("refusing the file name %r from the source: it would leave the weights directory" % name)
    return name


def unsettled(dest, allowed=()):
    """Why a user could put a directory of their own where `dest` (or one below it) is, or None:
    a link, or a directory anyone but root can change, on the way from / (a sticky one, like
    /tmp, only above root's own), unless `allowed` (allow_shared_dirs) lists the one it is in.
    Whatever root writes goes through descriptors anyway; this keeps the service, which reads
    by path, from loading a user's files after a swap."""
    at, names = "/", dest.strip("/").split("/")
    for i, name in enumerate(names):
        parent, at = os.lstat(at), os.path.join(at, name)
        try:
            st = os.lstat(at)
        except FileNotFoundError:
            return None  # made by specops from here down: root's
        if safefs.shared(at, allowed) or safefs.shared(os.path.dirname(at), allowed):
            continue  # listed in allow_shared_dirs, or in a directory that is
        own = st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and i < len(names) - 1)
        if stat.S_ISLNK(st.st_mode):
            return "%s is a symbolic link" % at
        if st.st_uid != 0:
            return "%s is owned by %s" % (at, user_name(st.st_uid))
        if own:
            return "%s is writable by others (mode %o)" % (at, stat.S_IMODE(st.st_mode))
        if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX:
            return "%s is in a directory others can write" % at
    for root, dirs, _ in os.walk(dest):
        for d in dirs:
            st = os.lstat(os.path.join(root, d))
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o022:
                return "%s is not a directory of root's alone" % os.path.join(root, d)
    return None


def open_dest(dest, allowed, make=True):
    """The descriptor of the weights directory, made if missing (with any missing parent, root's
    0755; with make=False, Missing): reached from / through root's links only, owned by root and writable by no one
    else,
    so nothing can be planted in it while root writes there (a name swapped above it later moves
    nothing root writes: that goes through the descriptor).  The caller closes it."""
    problem = unsettled(dest, allowed)
    if problem:
        raise ActionError("%s: %s; weights go only into directories of root's that no one else can change, "
                          "all the way from / (allow_shared_dirs accepts one that is not)" % (dest, problem))
    try:
        dfd = safefs.open_dir(dest, for_writing=False)[0]
    except safefs.Missing:
        if not make:
            raise
        if SLOW_MKDIR and SLOW_MKDIR.rpartition(":")[0] == dest:
            import time
            open(SLOW_MKDIR_MARK, "w").close()
            time.sleep(float(SLOW_MKDIR.rpartition(":")[2]))
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


def hash_at(dfd, name, git=False):
    """The sha256 of the regular file `name` below `dfd` (never through a link; a FIFO cannot hang
    it); with `git`, its git blob sha1 (what a hub names a file not in LFS by)."""
    fd, base = parent_at(dfd, name)
    try:
        f = safefs.open_regular(fd, base, name, shared=False) if fd is not None else None
    finally:
        if fd is not None:
            os.close(fd)
    if f is None:
        raise ActionError("%s: no such file in the weights directory" % name)
    try:
        import hashlib  # only for git's blob ids: it loads OpenSSL
        return sha256_fd(f, hashlib.sha1(b"blob %d\0" % os.fstat(f).st_size) if git else None)
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
