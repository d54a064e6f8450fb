"""Weights copied from a peer box: rsync over SSH, host to host, never through the controller,
with a key made for that one copy.

The key pair is made here, in a root-only directory under PEER_DIR, and only its public half
leaves (the controller grants it on the peer: read-only, from this host's address, for minutes).
The directory goes when the copy ends, however it ends (a SIGTERM or the session's end included);
one a SIGKILLed agent left is swept when the next key is made (the host lock makes that safe).
The peer's host key is the one the controller accepted on its own connection; ssh here accepts
no other.  rsync writes by path, as root, so every directory from / to dest and below must be
root's alone (no link, nothing others can write: weightsdir.unsettled), and it brings exactly the files the peer
listed (--files-from; rsync's receiver refuses others), regular files only (no links, devices or
owners).  The manifest is written after, as for any other source.  The peer is a box of the same
inventory: its files are taken as they are.
"""
import os
import re
import shutil
import socket
import time

from specops import protocol
from specops.agent import safefs, weights
from specops.agent.weights import weightsdir
from specops.agent.host import ActionError, clean, on_interrupt, run_owned, say, sha256_file
from specops.layout import PEER_DIR

ALIAS = "specops-peer"  # the name the peer's host key is known by in the copy's known_hosts
MOVED = "specops-moved:"
_keys = {}  # id → unregisters its removal: the keys this agent made and no copy has used yet


def key(req):
    """Answer a protocol.PeerKey: a fresh key pair, and the address the copy will come from."""
    if not shutil.which("ssh-keygen") or not shutil.which("rsync"):
        raise ActionError("a copy from a peer needs rsync and the OpenSSH client on this host "
                          "(Debian/Ubuntu: apt-get install rsync openssh-client)")
    safefs.make_dir(PEER_DIR, 0o700, 0, 0)
    for old in os.listdir(PEER_DIR):  # a killed run's key: no run holds it (we hold the host lock)
        shutil.rmtree(os.path.join(PEER_DIR, old), ignore_errors=True)
    key_id = os.urandom(8).hex()
    where = os.path.join(PEER_DIR, key_id)
    os.mkdir(where, 0o700)
    _keys[key_id] = on_interrupt(
        lambda: shutil.rmtree(where, ignore_errors=True)
    )  # gone with the session at the latest
    address = _resolve(req.address, req.port)
    rc, _, err = run_owned(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", ALIAS, "-f", where + "/id"])
    if rc != 0:
        shutil.rmtree(where, ignore_errors=True)
        raise ActionError("ssh-keygen failed: %s" % clean(err.strip())[-300:])
    with open(where + "/id.pub") as f:
        public = " ".join(f.read().split()[:2])
    return protocol.PeerKeyResult(id=key_id, public_key=public, source=_source_address(address, req.port),
                                  address=address)


def _resolve(address, port):
    """The peer's numeric address as this host resolves it (rsync then uses that one)."""
    try:
        return socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as e:
        raise ActionError("the peer's address %s does not resolve here: %s" % (address, e))


def _source_address(address, port):
    """The address this host reaches the peer from (what the peer's sshd will see): asked of
    the kernel's routing by a UDP socket that sends nothing."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, port))
        except OSError as e:
            raise ActionError("no route from here to the peer at %s: %s" % (address, e.strerror))
        return s.getsockname()[0].split("%")[0]


def copy(req):
    """Answer a protocol.PeerCopy: rsync the peer's files into dest, hash what moved, write the manifest."""
    if not re.match(r"^[0-9a-f]{16}$", req.id):
        raise ActionError("bad copy key id %r" % req.id)
    where = os.path.join(PEER_DIR, req.id)
    forget = _keys.pop(req.id, lambda: None)
    try:
        return _copy(req, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)
        forget()


def _copy(req, where):
    if not os.path.isfile(where + "/id"):
        raise ActionError("no copy key %r on this host (made by an earlier request of this run)" % req.id)
    problem = weightsdir.unsettled(req.dest)
    if problem:  # rsync writes by path, as root: no directory on its way may be anyone else's
        raise ActionError("%s: %s; root's rsync writes there by path, so every directory from / must be "
                          "root's alone" % (req.dest, problem))
    dfd = weightsdir.open_dest(req.dest, ())
    try:
        return _copy_into(req, where, dfd)
    finally:
        os.close(dfd)


def _copy_into(req, where, dfd):
    for name, (size, _) in req.files.items():
        weightsdir.safe_name(name)
        if not isinstance(size, int) or size < 0:
            raise ActionError("the peer listed %r with the size %r" % (name, size))
    for name in req.files:  # not root's alone (rewritten, its mtime put back?): rsync's quick check would keep it
        st = weightsdir.lstat_at(dfd, name)
        if st is not None and (st.st_uid != 0 or st.st_mode & 0o022):
            weightsdir.unlink_at(dfd, name)
    old = (weights.read_manifest(req.dest) or {}).get("files") or {}
    need = sum(size for name, (size, mtime) in req.files.items() if not _same(req.dest, name, size, mtime))
    label = "%s:%s" % (req.peer, req.path)
    weights.check_disk(label, req.dest, need)  # before any byte moves
    with open(where + "/known_hosts", "w") as f:
        f.write("%s %s\n" % (ALIAS, req.host_key))
    with open(where + "/files", "wb") as f:
        f.write(b"".join(name.encode("utf-8", "surrogateescape") + b"\0" for name in sorted(req.files)))
    ssh = " ".join(["ssh", "-F", "/dev/null", "-i", where + "/id", "-p", str(req.port), "-o", "IdentitiesOnly=yes",
                    "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "HostKeyAlias=" + ALIAS,
                    "-o", "UserKnownHostsFile=" + where + "/known_hosts", "-o", "GlobalKnownHostsFile=/dev/null",
                    "-o", "ConnectTimeout=20", "-o", "ServerAliveInterval=15"])
    # The listed files and their mtimes (the manifest's no-op test); no -l/-D/-o/-g: a link, a
    # device or an owner on the peer does not become one here; files readable by the service's
    # user (644).  --partial: a cut file is the basis of the next run's transfer, which then moves
    # only what is missing.  -8: names in the output as they are.
    argv = ["rsync", "-t", "-8", "--files-from=" + where + "/files", "--from0", "--perms", "--chmod=D755,F644",
            "--partial", "--timeout=120", "--stats", "--out-format=" + MOVED + "%n", "-e", ssh] + \
        (["--checksum"] if req.verify else []) + \
        ["%s@%s:./" % (req.user, _bracketed(req.address)), req.dest + "/"]
    say("  copying %s (%.1f MiB to move) from %s" % (label, need / 2**20, req.address))
    rc, out, err = run_owned(argv, env=_env(), progress=weights.meter(label, dfd, need))
    if rc != 0:
        lines = [clean(l) for l in err.strip().splitlines() if l.strip()]
        why = ([l for l in lines if not l.startswith("rsync error")] or lines or ["exit %d" % rc])[0]
        if any("Permission denied (publickey" in l for l in lines):
            why = "the peer refused the copy key (does its sshd see this host as %s?)" % req.source_address
        elif any("Host key verification failed" in l for l in lines):
            why = "the peer's host key at %s is not the one the controller accepted" % req.address
        raise ActionError("copy from %s failed (rsync exit %d): %s" % (label, rc, why[-300:]))
    moved = [l[len(MOVED):] for l in out.splitlines() if l.startswith(MOVED) and not l.endswith("/")]
    received = _stat(out, "Total bytes received")
    files = {}
    for name, (size, _) in sorted(req.files.items()):
        path = os.path.join(req.dest, name)
        st = weights.regular(path)
        if st is None or st.st_size != size:
            raise ActionError("%s: not the %d bytes the peer listed (it changed during the copy?)" % (path, size))
        known = old.get(name) or {}
        same = known.get("size") == size and known.get("mtime_ns") == st.st_mtime_ns and name not in moved
        files[name] = {"size": size, "mtime_ns": st.st_mtime_ns,
                       "sha256": known["sha256"] if same and known.get("sha256") else sha256_file(path)}
    weights.write_manifest(req.dest, {"dest": req.dest, "source": req.source, "commit": None, "files": files,
                                      "fetched": time.time()})
    say("  weights %s: %d file(s), %d copied, %.1f MiB received" % (label, len(files), len(moved), received / 2**20))
    return protocol.PeerCopyResult(received=received, copied=moved, files=len(files))


def _same(dest, name, size, mtime_ns):
    """Already here as the peer has it (rsync's own quick check: size and mtime)."""
    st = weights.regular(os.path.join(dest, name))
    return st is not None and st.st_size == size and st.st_mtime_ns // 10**9 == mtime_ns // 10**9


def _bracketed(address):
    return "[%s]" % address if ":" in address else address


def _env():
    """rsync's environment: nothing of root's (no agent socket, no RSYNC_* settings, no locale
    that changes how names are written)."""
    return {"PATH": os.environ.get("PATH") or "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C",
            "HOME": PEER_DIR}


def _stat(out, name):
    """A number from rsync's --stats ("Total bytes received: 1,234"), 0 if absent."""
    for line in out.splitlines():
        if line.startswith(name + ":"):
            return int(re.sub(r"[^0-9]", "", line.split(":", 1)[1].split()[0]) or 0)
    return 0
