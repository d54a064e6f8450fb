"""Model weights on the host: what is there (a manifest per directory), fetching them from a
Hugging Face hub, and proving them.

After a verified fetch the directory has a manifest (WEIGHTS_DIR, root-only): the source as the
inventory gave it, the commit it resolved to, and each file's size, mtime and sha256 (from the
hub's LFS metadata, or computed once).  The probe compares sizes and mtimes only, so a no-op on a
terabyte moves and hashes nothing; a fetch with `verify` hashes everything and fetches again only
the files that differ.  A change made behind the manifest's back without touching size or mtime
goes unnoticed until then: that is the price of not hashing 1 TB on every run.

The hub is asked through weights/hub.py, a peer through weights/peercopy.py, and the directory
itself is used only through weights/weightsdir.py; a run cut mid-file resumes from its NAME.part.  Weights go
only into a directory root owns and no one else can write, reached from / through root's links
only (open_dest), and a file name from a listing that would leave it is refused.  Every read,
write, rename and unlink in it goes through that directory's descriptor (the hub client writes
into .part files the agent opened and hands it), never through its path: a user who can rename
a directory above it cannot point a write of root's elsewhere.
"""
import json
import os
import stat
import time

from specops.agent import safefs
from specops.agent.weights import weightsdir
from specops.agent.weights.hub import ask, download, tool_python
from specops.agent.host import ActionError, say, sha256
from specops.layout import WEIGHTS_DIR

MARGIN = 0.02          # free space kept beyond what the fetch needs, as a fraction of it ...
MARGIN_MIN = 64 << 20  # ... and at least this many bytes


def manifest_path(dest):
    return os.path.join(WEIGHTS_DIR, sha256(dest.encode()).hexdigest()[:24] + ".json")


def read_manifest(dest):
    try:
        return json.loads(safefs.read_file(manifest_path(dest)) or "null")
    except (OSError, ValueError, safefs.UnsafePath):
        return None


def fact(dest, allowed=()):
    """For the probe: the manifest, the files that differ from it (size or mtime, or gone: all of
    them where a user could have swapped the directory, or did), the [ctime, name] of its file
    changed last (`newest`: what a server that started before it does not run), and the free
    bytes where the weights go."""
    m = read_manifest(dest)
    try:
        dfd = weightsdir.open_dest(dest, allowed, make=False)
    except ActionError:  # missing, or not safe to look in: fetch says which
        dfd = None
    try:
        differ, newest = _looked_at(dfd, m, hashing=True)
        partial, present = {}, {}  # a cut transfer's NAME.part files (where to resume), and the whole ones
        for rel, st in (weightsdir.files(dfd) if dfd is not None else ()):
            if rel.endswith(".part"):
                partial[rel[:-len(".part")]] = st.st_size
            else:
                present[rel] = st.st_size
    finally:
        if dfd is not None:
            os.close(dfd)
    return {"manifest": m, "differ": differ, "newest": newest, "free": _free(dest),
            "device": os.stat(_existing(dest)).st_dev, "partial": partial, "present": present}


def _looked_at(dfd, m, hashing=False):
    """(the manifest's files that differ from it, [ctime, name] of the one changed last or None).
    A ctime cannot be put back: a file rewritten or edited, whatever its mtime says, is newer.
    With `hashing` (the probe), a file written after its manifest (its ctime) with its size and
    mtime kept is hashed: an edit that put them back is drift, and a deploy fetches it again
    rather than restart the server onto it (a chmod costs that file's hash on each look)."""
    differ, newest = [], None
    written = (m or {}).get("written_at")
    for name, known in ((m or {}).get("files") or {}).items():
        st = weightsdir.lstat_at(dfd, name) if dfd is not None else None
        if not _same(st, known):
            differ.append(name)
        elif hashing and written and st.st_ctime > written and known.get("sha256") \
                and weightsdir.hash_at(dfd, name) != known["sha256"]:
            differ.append(name)
        if st is not None and (newest is None or st.st_ctime > newest[0]):
            newest = [st.st_ctime, name]
    return differ, newest


def seen(dest):
    """For verify: (manifest, differ, newest) as the probe says them, the directory reached
    through root's links only (it is only read)."""
    m = read_manifest(dest)
    try:
        dfd = safefs.open_dir(dest, for_writing=False)[0]
    except (OSError, safefs.UnsafePath):
        dfd = None
    try:
        return (m,) + _looked_at(dfd, m)
    finally:
        if dfd is not None:
            os.close(dfd)


def _same(st, known):
    """The file the manifest knows: its size and mtime, and still root's alone (a file another
    user owns or can write may have been changed with its mtime put back)."""
    return (st is not None and st.st_size == known.get("size") and st.st_mtime_ns == known.get("mtime_ns")
            and st.st_uid == 0 and not st.st_mode & 0o022)


def _existing(path):
    """The nearest directory at or above path that exists (where it would be made)."""
    while path and not os.path.isdir(path):
        path = os.path.dirname(path)
    return path or "/"


def _free(path):
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize


def content_digest(files):
    """What the weights are, by content: the sha256 of every file's name and sha256."""
    return sha256(json.dumps(sorted((n, (f or {}).get("sha256")) for n, f in files.items())).encode()
                          ).hexdigest()


def write_manifest(dest, manifest):
    """Written whole (fsync'd, renamed) in the root-only WEIGHTS_DIR, with the content `digest` and
    `changed_at`: when that digest last changed (what a server that started before it runs old
    weights by)."""
    manifest = dict(manifest, digest=content_digest(manifest.get("files") or {}), written_at=time.time())
    old = read_manifest(dest) or {}
    if content_digest(old.get("files") or {}) == manifest["digest"]:
        manifest["changed_at"] = old.get("changed_at", 0)  # 0: unchanged since before it was kept
    else:
        manifest["changed_at"] = time.time()
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


def meter(what, dfd, need):
    """A progress callback: every 2 s, the bytes that arrived in the directory `dfd`, the rate and the ETA."""
    before, t0, last = weightsdir.on_disk(dfd), time.time(), [0.0]

    def progress():
        now = time.time()
        if now - last[0] >= 2:
            last[0] = now
            got = weightsdir.on_disk(dfd) - before
            rate = got / max(now - t0, 1e-3)
            eta = (need - got) / rate if rate > 0 else 0
            say("  weights %s: %.1f/%.1f MiB, %.1f MiB/s, ETA %.0fs" % (what, got / 2**20, need / 2**20,
                                                                       rate / 2**20, max(eta, 0)))
    return progress


def regular(path):
    """lstat of a regular file (hashed only then: never a link, a FIFO or a device), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def record(req, allowed):
    """Answer a protocol.RecordWeights: after a push from the controller, the manifest of `dest`
    (the pushed files hashed now and compared with the controller's, the others' hashes kept)."""
    old = (read_manifest(req.dest) or {}).get("files") or {}
    files = {}
    dfd = weightsdir.open_dest(req.dest, allowed)
    try:
        for name, size in sorted(req.files.items()):
            st = weightsdir.lstat_at(dfd, name)
            path = os.path.join(req.dest, name)
            if st is None or st.st_size != size:
                raise ActionError("%s: not the %d bytes of the controller's copy" % (path, size))
            known = old.get(name) or {}
            same = _same(st, known) and name not in req.pushed
            digest = known["sha256"] if same else weightsdir.hash_at(dfd, name)
            if name in req.expect and digest != req.expect[name]:
                weightsdir.unlink_at(dfd, name)  # a stale .part resumed into it: gone, so the next run sends it whole
                raise ActionError("%s differs from the controller's copy (sha256 %s, not %s); removed, run again"
                                  % (path, digest[:12], req.expect[name][:12]))
            files[name] = {"size": size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    finally:
        os.close(dfd)
    write_manifest(req.dest, {"dest": req.dest, "source": req.source, "commit": None, "files": files,
                               "fetched": time.time()})
    return {"files": len(files), "hashed": len(req.pushed)}


def _stale(dfd, f, known, verify, moved_on, written=None):
    """Whether a file on the host must be fetched again: gone, the wrong size, or not root's alone
    (whoever could write it may have); else, when it differs from the manifest, was written after
    it (its ctime, past `written`), with verify, or at a new commit, a hash that is not the hub's:
    the LFS sha256, or the git blob sha1 of a file not in LFS (without one: the manifest's sha256,
    and at a new commit it is fetched again)."""
    st = weightsdir.lstat_at(dfd, f["name"])
    if st is None or st.st_size != f["size"] or st.st_uid != 0 or st.st_mode & 0o022:
        return True
    if known and _same(st, known) and not verify and not (written and st.st_ctime > written) and (
            known.get("sha256") == f["sha256"] if f["sha256"] else not moved_on):
        return False
    if f["sha256"] or f.get("blob"):
        return weightsdir.hash_at(dfd, f["name"], git=not f["sha256"]) != (f["sha256"] or f["blob"])
    want = (known or {}).get("sha256")
    return moved_on or not want or weightsdir.hash_at(dfd, f["name"]) != want


def _part_size(dfd, name):
    st = weightsdir.lstat_at(dfd, name + ".part")
    return st.st_size if st else 0


def fetch(req, allowed):
    """Answer a protocol.FetchWeights: the files the source lists, at the commit it resolves to."""
    dfd = weightsdir.open_dest(req.dest, allowed)
    try:
        return _fetch(req, dfd)
    finally:
        os.close(dfd)


def _fetch(req, dfd):
    python = tool_python(req)
    info = json.loads(ask(python, req, "info", {"repo": req.repo, "revision": req.revision,
                                                  "allow_patterns": req.allow_patterns}))
    manifest = read_manifest(req.dest) or {}
    old, moved_on = manifest.get("files") or {}, manifest.get("commit") not in (None, info["commit"])
    for f in info["files"]:
        weightsdir.safe_name(f["name"])
        if f["size"] is None:
            raise ActionError("the hub gives no size for %s: cannot check the disk or the download" % f["name"])
    stale = [f for f in info["files"]
             if _stale(dfd, f, old.get(f["name"]), req.verify, moved_on, manifest.get("written_at"))]
    need = sum(f["size"] - _part_size(dfd, f["name"]) for f in stale)
    check_disk("%s@%s" % (req.repo, req.revision), req.dest, need)  # before any byte moves or is removed
    for f in stale:
        if weightsdir.lstat_at(dfd, f["name"]) is not None:
            say("  %s differs: fetched again" % f["name"])
            weightsdir.unlink_at(dfd, f["name"])
    before = weightsdir.on_disk(dfd)
    if stale:
        download(req, python, dfd, info["commit"], stale, meter(req.repo, dfd, need))
    moved = max(weightsdir.on_disk(dfd) - before, 0)
    files = {}
    for f in info["files"]:
        st = weightsdir.lstat_at(dfd, f["name"])
        if st is None:
            raise ActionError("%s: the download left no file" % os.path.join(req.dest, f["name"]))
        known = old.get(f["name"]) or {}
        keep = f not in stale and known.get("sha256") and (known["sha256"] == f["sha256"] if f["sha256"]
                                                           else _same(st, known))  # else hashed now
        digest = known["sha256"] if keep else weightsdir.hash_at(dfd, f["name"])
        if f["sha256"] and digest != f["sha256"]:
            raise ActionError("%s: sha256 %s, the hub says %s" % (os.path.join(req.dest, f["name"]), digest[:12],
                                                                  f["sha256"][:12]))
        files[f["name"]] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    write_manifest(req.dest, {"dest": req.dest, "source": req.source, "commit": info["commit"], "files": files,
                               "fetched": time.time()})
    say("  weights %s@%s (%s): %d file(s), %.1f MiB moved" % (req.repo, req.revision, info["commit"][:12],
                                                             len(files), moved / 2**20))
    return {"commit": info["commit"], "moved": moved, "fetched": [f["name"] for f in stale]}
