"""Paths on a shared box, where other users own directories specops reads and writes in.

Every path is walked from / one component at a time through directory descriptors: a
symbolic link is followed only when root owns it (anyone else's link could point anywhere),
and the directory a file is written in must be writable by root alone, unless the
inventory lists it in `allow_shared_dirs`.  New content is staged beside its target
(stagedir.StageDir) and renamed into place through the same descriptors.
"""
import os
import stat

from specops.agent.host import ActionError, user_name

MAX_LINKS = 40
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafePath(ActionError):
    """A path another user could redirect; the message says which part and why."""


class Missing(UnsafePath):
    """A directory on the path does not exist."""


PLAIN_MODE = 0o777  # what specops writes: never setuid, setgid or sticky, whatever it replaces


def _components(path, link=False):
    """The names along an absolute path; '..' only inside root's own links (resolved lexically)."""
    if not path.startswith("/"):
        raise UnsafePath("%s: not an absolute path" % path)
    parts = [p for p in (os.path.normpath(path) if link else path).split("/") if p and p != "."]
    if ".." in parts:
        raise UnsafePath("%s: '..' in a managed path" % path)
    return parts


def writable_by_others(st):
    return st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def shared(path, allowed):
    return any(path == a.rstrip("/") or path.startswith(a.rstrip("/") + "/") for a in allowed)


def open_dir(path, allowed=(), for_writing=True):
    """(fd, real path) of directory `path`.  Links in it are followed only when root owns them;
    with for_writing, the directory itself must be writable by root alone (or allowed)."""
    todo, fd, real, links = _components(path), os.open("/", O_DIR), "", 0
    try:
        while todo:
            name = todo.pop(0)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if st.st_uid != 0 or links > MAX_LINKS:
                    raise UnsafePath("%s: %s/%s is a symbolic link owned by %s; specops follows only root's links"
                                     % (path, real, name, user_name(st.st_uid)))
                target = os.readlink(name, dir_fd=fd)
                todo = _components(target if target.startswith("/") else real + "/" + target, link=True) + todo
                os.close(fd)
                fd, real = os.open("/", O_DIR), ""
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePath("%s: %s/%s is not a directory" % (path, real, name))
            nfd = os.open(name, O_DIR, dir_fd=fd)
            os.close(fd)
            fd, real = nfd, real + "/" + name
        real = real or "/"
        if for_writing:
            st = os.fstat(fd)
            if writable_by_others(st) and not shared(real, allowed):
                who = user_name(st.st_uid) if st.st_uid != 0 else "its group or every user"
                raise UnsafePath("%s: the directory is writable by %s (mode %04o), who could swap what specops "
                                 "writes there; list it in allow_shared_dirs to write there anyway"
                                 % (real, who, stat.S_IMODE(st.st_mode)))
        return fd, real
    except OSError as e:
        os.close(fd)
        raise (Missing if isinstance(e, FileNotFoundError) else UnsafePath)("%s: %s" % (path, e.strerror))
    except UnsafePath:
        os.close(fd)
        raise


def close(opened):
    os.close(opened[0])  # what open_dir returned


def lstat_in(dfd, name):
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_regular(dfd, name, path, shared=True, flags=os.O_RDONLY):
    """fd of the regular file `name` in directory `dfd`, or None if there is none: opened without
    following a link and without blocking (a FIFO swapped in cannot hang the agent), then checked
    on the fd itself.  In a directory others can write to (`shared`), a file with other hard links
    is refused: with protected_hardlinks off, a user could link a file of root's there."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UnsafePath("%s: %s" % (path, e.strerror))
    st = os.fstat(fd)
    problem = None if stat.S_ISREG(st.st_mode) else "not a regular file"
    if problem is None and shared and st.st_nlink > 1:
        problem = "it has %d hard links" % st.st_nlink
    if problem:
        os.close(fd)
        raise UnsafePath("%s: %s; specops does not read or replace it" % (path, problem))
    return fd


def _shared_dir(dfd):
    return writable_by_others(os.fstat(dfd))


def read_file(path, allowed=()):
    """The content of a regular file, read safely (None if there is none)."""
    parent, name = os.path.split(path)
    dfd, _ = open_dir(parent, allowed, for_writing=False)
    try:
        fd = open_regular(dfd, name, path, _shared_dir(dfd))
    finally:
        os.close(dfd)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def make_dir(path, mode, uid, gid, allowed=(), parents=False):
    """A directory at `path` (made if missing; `parents`: those above it too, root's 0755) with this mode and owner."""
    parent, name = os.path.split(path.rstrip("/"))
    if parents and parent != "/" and not os.path.isdir(parent):  # only a hint: what follows walks safely
        make_dir(parent, 0o755, 0, 0, allowed, parents=True)
    pfd, _ = open_dir(parent, allowed)
    try:
        try:
            os.mkdir(name, mode, dir_fd=pfd)
        except FileExistsError:
            pass
        fd = os.open(name, O_DIR, dir_fd=pfd)  # a link planted there is refused, not followed
        try:
            owner = os.fstat(fd).st_uid  # another's (made between a check and the mkdir?) is not taken over
            if uid != -1 and owner not in (0, uid):
                raise UnsafePath("%s: a directory of %s's, not made by specops; refused" % (path, user_name(owner)))
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    except OSError as e:
        raise UnsafePath("%s: %s" % (path, e.strerror))
    finally:
        os.close(pfd)


def set_attrs(path, mode, uid, gid, allowed=()):
    """Mode and owner of an existing regular file, set through an fd opened without following links."""
    parent, name = os.path.split(path)
    pfd, _ = open_dir(parent, allowed)
    try:
        fd = open_regular(pfd, name, path, _shared_dir(pfd))
        if fd is None:
            raise UnsafePath("%s: no such file" % path)
        try:
            os.fchown(fd, uid, gid)
            if mode is not None:
                os.fchmod(fd, mode & PLAIN_MODE)
        finally:
            os.close(fd)
    except OSError as e:
        raise UnsafePath("%s: %s" % (path, e.strerror))
    finally:
        os.close(pfd)


def remove(path, backup=None, allowed=()):
    """Remove a file (kept at `backup` first) or an empty directory; a link is removed, never followed."""
    parent, name = os.path.split(path)
    pfd, _ = open_dir(parent, allowed)
    try:
        st = lstat_in(pfd, name)
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(name, dir_fd=pfd)
            return
        if backup and stat.S_ISREG(st.st_mode):
            _copy_out(pfd, name, backup, path)
        os.unlink(name, dir_fd=pfd)
    finally:
        os.close(pfd)


def _copy_out(dfd, name, to, path=None):
    """Copy a regular file (see open_regular) to `to`, a path in specops's own root-only tree, in
    chunks, keeping its permission bits (never setuid, setgid or sticky) and times.  Whole or not
    at all: a new file, synced, then renamed (an undo trusts a backup that exists)."""
    src = open_regular(dfd, name, path or name, _shared_dir(dfd))
    if src is None:
        return False
    tmp = "%s.%s.tmp" % (to, os.urandom(6).hex())
    with os.fdopen(src, "rb") as f:
        st = os.fstat(f.fileno())
        os.makedirs(os.path.dirname(to), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                for block in iter(lambda: f.read(1 << 20), b""):
                    out.write(block)
                os.fchmod(out.fileno(), stat.S_IMODE(st.st_mode) & PLAIN_MODE)
                os.utime(out.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
                out.flush()
                os.fsync(out.fileno())
            os.rename(tmp, to)
            dfd = os.open(os.path.dirname(to), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)  # the backup's name is on disk before the target it keeps is replaced
            finally:
                os.close(dfd)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    return True


def copy_out(path, to, allowed=()):
    """Copy the regular file at `path` to `to` without following a link anyone but root planted."""
    parent, name = os.path.split(path)
    pfd, _ = open_dir(parent, allowed, for_writing=False)
    try:
        return _copy_out(pfd, name, to, path)
    finally:
        os.close(pfd)
