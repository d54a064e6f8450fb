"""The peer's side of a host-to-host weights copy, run on the peer as its login user: grant a
key good for one read-only copy, revoke it, and list what the copy will bring.

It runs with the login user's own rights (root's only where the inventory logs in as root), so
the only authorized_keys it can touch is that user's, and a link planted there can only lead to
that user's own files.  The directory served must be one only root or that user can change (no
link on the way, nothing writable by others), so no one else can swap what the copy reads.

One JSON request on stdin, one JSON answer on stdout:

    {"op": "grant", "id": ID, "key": "ssh-ed25519 AAAA...", "from": "10.0.0.5",
     "path": "/models/x", "minutes": 10, "for": DEST}
        → {"files": {name: [size, mtime_ns]}, "expires": "YYYYMMDDHHMMSS", "user": NAME}
    {"op": "revoke", "id": ID} → {"removed": 1}

The line granted:

    restrict,from="10.0.0.5",expiry-time="...",command="/usr/bin/rrsync -ro /models/x" ssh-ed25519 AAAA...
    specops-peer:ID:EPOCH:DEST

`restrict` (no forwarding, no pty), only from the destination's address, accepted until the
expiry (the peer's local time, as sshd reads it), and only rsync reading that directory
(rrsync, shipped with rsync).  Each grant and revoke also drops specops-peer lines whose EPOCH
has passed, and a grant for DEST (the destination's inventory name) drops DEST's older ones: the
destination's host lock is held, so no other copy to it runs.  A run killed before its revoke
leaves nothing usable after its expiry, and nothing at all after the next copy to that host.
Edits hold flock on ~/.ssh (many hosts may copy from one peer at once) and replace the file
whole (a temp file, fsync'd, renamed), keeping every other line byte for byte (a missing final
newline is added).  The expiry is in the system's time zone, as sshd reads it.

Python 3.8+, standard library only; errors are one line on stderr and exit status 2.
"""

import fcntl
import ipaddress
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import sys
import time

MARK = "specops-peer:"
KEYS = "authorized_keys"
TEMP = "authorized_keys.specops-tmp"


class Refused(Exception):
    """Said on stderr as one line; nothing was changed."""


def ssh_dir(make, home=None):
    """An fd of the user's ~/.ssh (made 0700 when granting and missing), never through a link."""
    home = home or pwd.getpwuid(os.getuid()).pw_dir
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        home_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise Refused("home directory %s: %s" % (home, e.strerror))
    try:
        if make:
            try:
                os.mkdir(".ssh", 0o700, dir_fd=home_fd)
            except FileExistsError:
                pass
        try:
            return os.open(".ssh", flags, dir_fd=home_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise Refused("%s/.ssh is not a directory (a link is not followed): %s" % (home, e.strerror))
    finally:
        os.close(home_fd)


def expired(line, now, dest=None):
    """Whether a line is ours and its time has passed (or it was granted to `dest` before)."""
    words = line.split()
    if not words or not words[-1].startswith(MARK):
        return False
    try:
        _, _, epoch, owner = words[-1].split(":", 3)
        return int(epoch) < now or owner == dest
    except ValueError:
        return True  # ours, but not as we write it: not to be trusted


def ours(line, key_id):
    words = line.split()
    return bool(words) and words[-1].startswith("%s%s:" % (MARK, key_id))


def rewrite(fd, edit):
    """Replace authorized_keys by edit(lines) under flock; returns how many lines went."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        try:
            old = os.open(KEYS, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            text, mode = b"", 0o600
        except OSError as e:
            raise Refused("~/.ssh/%s cannot be opened (a link is not followed): %s" % (KEYS, e.strerror))
        else:
            with os.fdopen(old, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise Refused("~/.ssh/%s is not a regular file" % KEYS)
                text, mode = f.read(), stat.S_IMODE(st.st_mode)
        lines = text.decode("utf-8", "surrogateescape").splitlines(True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        kept = edit(lines)
        if kept == lines:
            return 0
        try:
            os.unlink(TEMP, dir_fd=fd)  # a killed run's
        except FileNotFoundError:
            pass
        tmp = os.open(TEMP, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        with os.fdopen(tmp, "wb") as f:
            f.write("".join(kept).encode("utf-8", "surrogateescape"))
            os.fchmod(f.fileno(), mode)
            f.flush()
            os.fsync(f.fileno())
        os.rename(TEMP, KEYS, src_dir_fd=fd, dst_dir_fd=fd)
        return len(lines) - len([k for k in kept if k in lines])
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def settled(path):
    """Refuse a path that someone but root or this user could swap: a link on the way, or a
    directory on it that others can write (a sticky one, like /tmp, only above root's own)."""
    me, at, names = os.getuid(), "/", path.strip("/").split("/")
    for i, name in enumerate(names):
        parent, at = os.lstat(at), os.path.join(at, name)
        try:
            st = os.lstat(at)
        except OSError as e:
            raise Refused("%s: %s" % (at, e.strerror))
        if stat.S_ISLNK(st.st_mode):
            raise Refused("%s is a symbolic link; the directory copied must be reached without one" % at)
        shared = st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and i < len(names) - 1)
        if st.st_uid not in (0, me) or shared:
            raise Refused("%s can be changed by others than root and this user (owner uid %d, mode %o)"
                          % (at, st.st_uid, stat.S_IMODE(st.st_mode)))
        if parent.st_mode & 0o022 and not (parent.st_mode & stat.S_ISVTX and st.st_uid in (0, me)):
            raise Refused("%s is in a directory others can write" % at)


def listing(path):
    """name → [size, mtime_ns] of the regular files under path (what rsync will bring)."""
    if not os.path.isdir(path) or os.path.islink(path):
        raise Refused("%s is not a directory here" % path)
    files = {}
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                files[os.path.relpath(full, path)] = [st.st_size, st.st_mtime_ns]
    if not files:
        raise Refused("%s holds no files" % path)
    return files


def grant(req, home=None):
    key_id, key, source, path, dest = req["id"], req["key"], req["from"], req["path"], req["for"]
    if not re.match(r"^[0-9a-f]{8,64}$", key_id):
        raise Refused("bad key id")
    if not re.match(r"^[A-Za-z0-9._-]{1,64}$", dest):
        raise Refused("bad destination name %r" % dest)
    if not re.match(r"^ssh-ed25519 [A-Za-z0-9+/]+=*$", key.strip()):
        raise Refused("not an ed25519 public key")
    ip = ipaddress.ip_address(source)  # a ValueError names it
    if getattr(ip, "scope_id", None):
        raise Refused("refusing the address %r: a scoped address cannot be matched by from=" % source)
    if not path.startswith("/") or re.search(r'["\'\\\x00-\x1f\x7f]', path):
        raise Refused("refusing the path %r: absolute, without quotes, backslashes or control characters" % path)
    settled(path)
    rrsync = shutil.which("rrsync") or ""
    if not rrsync or not shutil.which("rsync"):
        raise Refused("rsync with its rrsync (Debian/Ubuntu: the rsync package, 3.2.4 or later) is not installed")
    files = listing(path)
    deadline = int(time.time() + 60 * float(req["minutes"]))
    os.environ.pop("TZ", None)  # sshd reads expiry-time in the system's zone, not this login's
    time.tzset()
    expires = time.strftime("%Y%m%d%H%M%S", time.localtime(deadline))
    line = 'restrict,from="%s",expiry-time="%s",command="%s -ro %s" %s %s%s:%d:%s\n' % (
        ip, expires, rrsync, shlex.quote(path), key.strip(), MARK, key_id, deadline, dest)
    fd = ssh_dir(make=True, home=home)
    try:
        now = time.time()
        rewrite(fd, lambda lines: [l for l in lines if not expired(l, now, dest) and not ours(l, key_id)] + [line])
    finally:
        os.close(fd)
    return {"files": files, "expires": expires, "user": pwd.getpwuid(os.getuid()).pw_name}


def revoke(req, home=None):
    if not re.match(r"^[0-9a-f]{8,64}$", req["id"]):
        raise Refused("bad key id")
    fd = ssh_dir(make=False, home=home)
    if fd is None:
        return {"removed": 0}
    try:
        now = time.time()
        return {"removed": rewrite(fd, lambda lines: [l for l in lines
                                                      if not expired(l, now) and not ours(l, req["id"])])}
    finally:
        os.close(fd)


def main():
    try:
        req = json.loads(sys.stdin.read())
        answer = {"grant": grant, "revoke": revoke}[req["op"]](req)
    except (Refused, ValueError, KeyError, OSError) as e:
        sys.stderr.write("%s\n" % (e if isinstance(e, Refused) else "%s: %s" % (type(e).__name__, e)))
        sys.exit(2)
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    main()
