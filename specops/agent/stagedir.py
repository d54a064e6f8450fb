"""New content beside its target, on a shared box: written into a directory specops creates
itself there (O_EXCL, 0700, its own; same filesystem, so the rename is atomic), opened
O_NOFOLLOW|O_EXCL, owned as the inventory says (never as the file it replaces), and renamed into
place through the same descriptors (safefs walks to them), so a name swapped after the checks
cannot redirect the write."""
import os
import stat

from specops.agent.safefs import O_DIR, PLAIN_MODE, UnsafePath, _copy_out, lstat_in, open_dir
from specops.layout import STAGE_PREFIX


class StageDir:
    """A directory specops creates beside a target (same filesystem, so the rename is atomic)."""

    def __init__(self, target, allowed=()):
        self.target, self.fd = target, -1
        self.parent_fd, self.parent = open_dir(os.path.dirname(target), allowed)
        self.name = os.path.basename(target)
        try:
            st = lstat_in(self.parent_fd, self.name)
            if st is not None and not stat.S_ISREG(st.st_mode):
                kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                raise UnsafePath("%s is %s; specops replaces only regular files" % (target, kind))
            for _ in range(10):
                self.dir = STAGE_PREFIX + os.urandom(6).hex()
                try:
                    os.mkdir(self.dir, 0o700, dir_fd=self.parent_fd)
                    break
                except FileExistsError:
                    continue
            self.fd = os.open(self.dir, O_DIR, dir_fd=self.parent_fd)
            st = os.fstat(self.fd)
            if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
                raise UnsafePath("%s: the staging directory is not ours" % target)
        except OSError as e:
            self.remove()
            raise UnsafePath("%s: cannot stage beside it: %s" % (target, e.strerror))
        except UnsafePath:
            self.remove()
            raise
        self.path = os.path.join(self.parent, self.dir, self.name)  # what a validator reads

    def write(self, data, mode, uid, gid):
        fd = os.open(self.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=self.fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode & PLAIN_MODE)
        finally:
            os.close(fd)

    def commit(self):
        os.rename(self.name, self.name, src_dir_fd=self.fd, dst_dir_fd=self.parent_fd)
        os.fsync(self.parent_fd)
        self.remove()

    def remove(self):
        if self.fd >= 0:
            try:
                os.unlink(self.name, dir_fd=self.fd)
            except OSError:
                pass
        if self.parent_fd >= 0 and getattr(self, "dir", None):
            try:
                os.rmdir(self.dir, dir_fd=self.parent_fd)
            except OSError:
                pass
        for fd in (self.fd, self.parent_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fd = self.parent_fd = -1

    def copy_current(self, to):
        """Keep the target's current content (if any) at `to`, a path specops owns."""
        return _copy_out(self.parent_fd, self.name, to, self.target)


def sweep(directory, allowed=()):
    """Remove what a staging cut off by a kill left beside its targets in `directory`: only
    directories of specops's name and making (root's, 0700), and the files in them.  Run by the
    next run that takes the lock (rollback.cut_off), so no other staging can be under way."""
    try:
        pfd, _ = open_dir(directory, allowed, for_writing=False)
    except (OSError, UnsafePath):
        return
    try:
        for name in os.listdir(pfd):
            st = lstat_in(pfd, name) if name.startswith(STAGE_PREFIX) else None
            if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o700:
                continue
            fd = os.open(name, O_DIR, dir_fd=pfd)
            try:
                for entry in os.listdir(fd):
                    os.unlink(entry, dir_fd=fd)
            finally:
                os.close(fd)
            os.rmdir(name, dir_fd=pfd)
    finally:
        os.close(pfd)
