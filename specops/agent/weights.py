"""Model weights on the host: what is there (a manifest per directory), fetching them from a
Hugging Face hub, and proving them.

After a verified fetch the directory has a manifest (WEIGHTS_DIR, root-only): the source as the
inventory gave it, the commit it resolved to, and each file's size, mtime and sha256 (from the
hub's LFS metadata, or computed once).  The probe compares sizes and mtimes only, so a no-op on a
terabyte moves and hashes nothing; a fetch with `verify` hashes everything and fetches again only
the files that differ.  A change made behind the manifest's back without touching size or mtime
goes unnoticed until then: that is the price of not hashing 1 TB on every run.

The hub is asked through agent/hub.py; a run cut mid-file resumes from its NAME.part.  Weights go
only into a directory root owns and no one else can write, and a file name from a listing that
would leave it is refused.
"""
import hashlib
import json
import os
import stat
import time

from specops.agent import safefs
from specops.agent.hub import ask, tool_python
from specops.agent.host import ActionError, say, sha256_file
from specops.layout import WEIGHTS_DIR

MARGIN = 0.02          # free space kept beyond what the fetch needs, as a fraction of it ...
MARGIN_MIN = 64 << 20  # ... and at least this many bytes


def manifest_path(dest):
    return os.path.join(WEIGHTS_DIR, hashlib.sha256(dest.encode()).hexdigest()[:24] + ".json")


def read_manifest(dest):
    try:
        return json.loads(safefs.read_file(manifest_path(dest)) or "null")
    except (OSError, ValueError, safefs.UnsafePath):
        return None


def fact(dest):
    """For the probe: the manifest, the files that differ from it (size or mtime, or gone), and
    the free bytes where the weights go."""
    m = read_manifest(dest)
    differ = []
    for name, f in ((m or {}).get("files") or {}).items():
        try:
            st = os.lstat(os.path.join(dest, name))
            if st.st_size != f["size"] or st.st_mtime_ns != f["mtime_ns"]:
                differ.append(name)
        except OSError:
            differ.append(name)
    partial, present = {}, {}  # a cut transfer's NAME.part files (where to resume), and the whole ones
    walk = os.walk(dest) if os.path.isdir(dest) and not os.path.islink(dest) else ()
    for root, _, files in walk:
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), dest)
            if f.endswith(".part"):
                partial[rel[:-len(".part")]] = _size(os.path.join(root, f))
            elif regular(os.path.join(root, f)):
                present[rel] = _size(os.path.join(root, f))
    return {"manifest": m, "differ": differ, "free": _free(dest), "device": os.stat(_existing(dest)).st_dev,
            "partial": partial, "present": present}


def _existing(path):
    """The nearest directory at or above path that exists (where it would be made)."""
    while path and not os.path.isdir(path):
        path = os.path.dirname(path)
    return path or "/"


def _free(path):
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize


def write_manifest(dest, manifest):
    """Written whole (fsync'd, renamed) in the root-only WEIGHTS_DIR."""
    os.makedirs(WEIGHTS_DIR, mode=0o700, exist_ok=True)
    path = manifest_path(dest)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def check_disk(what, dest, need):
    """Refuse, with the figures, when dest's filesystem cannot hold `need` more bytes and a margin."""
    free, margin = _free(dest), max(MARGIN * need, MARGIN_MIN)
    if need and free < need + margin:
        raise ActionError("not enough disk for %s in %s: need %.1f MiB (+%.0f MiB margin), %.1f MiB free"
                          % (what, dest, need / 2**20, margin / 2**20, free / 2**20))


def meter(what, dest, need):
    """A progress callback: every 2 s, the bytes that arrived in dest, the rate and the ETA."""
    before, t0, last = _on_disk(dest), time.time(), [0.0]

    def progress():
        now = time.time()
        if now - last[0] >= 2:
            last[0] = now
            got = _on_disk(dest) - before
            rate = got / max(now - t0, 1e-3)
            eta = (need - got) / rate if rate > 0 else 0
            say("  weights %s: %.1f/%.1f MiB, %.1f MiB/s, ETA %.0fs" % (what, got / 2**20, need / 2**20,
                                                                       rate / 2**20, max(eta, 0)))
    return progress


def _size(path):
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _on_disk(dest):
    """Bytes under dest, the partial downloads included."""
    total = 0
    for root, dirs, files in os.walk(dest):
        for f in files:
            total += _size(os.path.join(root, f))
    return total


def safe_name(name):
    """A file name from a listing, refused unless it stays inside the directory."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise ActionError("refusing the file name %r from the source: it would leave the weights directory" % name)
    return name


def regular(path):
    """lstat of a regular file (hashed only then: never a link, a FIFO or a device), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def own_dir(dest, allowed):
    """The weights go only into a directory root owns and no one else can write (made if missing):
    nothing can be planted in it while root writes there."""
    if not os.path.lexists(dest):
        safefs.make_dir(dest, 0o755, 0, 0, allowed=allowed)
    st = os.lstat(dest)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise ActionError("%s is %s; specops puts weights only in a directory that root owns and only root "
                          "can write (move it away to have it made)" % (dest, "not a directory" if not
                          stat.S_ISDIR(st.st_mode) else "owned by uid %d, mode %o" % (st.st_uid, st.st_mode & 0o777)))


def record(req, allowed):
    """Answer a protocol.RecordWeights: after a push from the controller, the manifest of `dest`
    (the pushed files hashed now and compared with the controller's, the others' hashes kept)."""
    old = (read_manifest(req.dest) or {}).get("files") or {}
    files = {}
    for name, size in sorted(req.files.items()):
        path = os.path.join(req.dest, safe_name(name))
        st = regular(path)
        if st is None or st.st_size != size:
            raise ActionError("%s: not the %d bytes of the controller's copy" % (path, size))
        known = old.get(name) or {}
        same = known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns and name not in req.pushed
        digest = known["sha256"] if same else sha256_file(path)
        if name in req.expect and digest != req.expect[name]:
            os.unlink(path)  # a stale .part resumed into it: gone, so the next run sends it whole
            raise ActionError("%s differs from the controller's copy (sha256 %s, not %s); removed, run again"
                              % (path, digest[:12], req.expect[name][:12]))
        files[name] = {"size": size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    write_manifest(req.dest, {"dest": req.dest, "source": req.source, "commit": None, "files": files,
                               "fetched": time.time()})
    return {"files": len(files), "hashed": len(req.pushed)}


def _stale(f, path, known, verify, moved_on):
    """Whether a file on the host must be fetched again: gone or the wrong size; a new commit
    (a file the hub gives no sha256 for); or, when it differs from the manifest or with verify,
    a hash that is not the hub's (or the manifest's)."""
    st = regular(path)
    if st is None or st.st_size != f["size"]:
        return True
    if moved_on and not f["sha256"]:
        return True
    unchanged = known and known["size"] == st.st_size and known["mtime_ns"] == st.st_mtime_ns
    want = f["sha256"] or (known or {}).get("sha256")
    if unchanged and not verify and (not f["sha256"] or known.get("sha256") == f["sha256"]):
        return False
    return not want or sha256_file(path) != want


def fetch(req, allowed):
    """Answer a protocol.FetchWeights: the files the source lists, at the commit it resolves to."""
    own_dir(req.dest, allowed)
    python = tool_python(req)
    info = json.loads(ask(python, req, "info", {"repo": req.repo, "revision": req.revision,
                                                  "allow_patterns": req.allow_patterns}))
    manifest = read_manifest(req.dest) or {}
    old, moved_on = manifest.get("files") or {}, manifest.get("commit") not in (None, info["commit"])
    for f in info["files"]:
        safe_name(f["name"])
        if f["size"] is None:
            raise ActionError("the hub gives no size for %s: cannot check the disk or the download" % f["name"])
    stale = [f for f in info["files"] if _stale(f, os.path.join(req.dest, f["name"]), old.get(f["name"]),
                                                 req.verify, moved_on)]
    need = sum(f["size"] - _size(os.path.join(req.dest, f["name"] + ".part")) for f in stale)
    check_disk("%s@%s" % (req.repo, req.revision), req.dest, need)  # before any byte moves or is removed
    for f in stale:
        if os.path.lexists(os.path.join(req.dest, f["name"])):
            say("  %s differs: fetched again" % f["name"])
            os.unlink(os.path.join(req.dest, f["name"]))
    before = _on_disk(req.dest)
    progress = meter(req.repo, req.dest, need)
    if stale:
        ask(python, req, "download", {"repo": req.repo, "commit": info["commit"], "dest": req.dest,
                                       "files": stale}, progress)
    moved = max(_on_disk(req.dest) - before, 0)
    files = {}
    for f in info["files"]:
        path = os.path.join(req.dest, f["name"])
        st = regular(path)
        known = old.get(f["name"]) or {}
        keep = f not in stale and known.get("sha256") and (not f["sha256"] or known["sha256"] == f["sha256"])
        digest = known["sha256"] if keep else sha256_file(path)
        if f["sha256"] and digest != f["sha256"]:
            raise ActionError("%s: sha256 %s, the hub says %s" % (path, digest[:12], f["sha256"][:12]))
        files[f["name"]] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    write_manifest(req.dest, {"dest": req.dest, "source": req.source, "commit": info["commit"], "files": files,
                               "fetched": time.time()})
    say("  weights %s@%s (%s): %d file(s), %.1f MiB moved" % (req.repo, req.revision, info["commit"][:12],
                                                             len(files), moved / 2**20))
    return {"commit": info["commit"], "moved": moved, "fetched": [f["name"] for f in stale]}
