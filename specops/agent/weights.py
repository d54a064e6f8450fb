"""Model weights on the host: what is there (a manifest per directory), fetching them from a
Hugging Face hub, and proving them.

After a verified fetch the directory has a manifest (WEIGHTS_DIR, root-only): the source as the
inventory gave it, the commit it resolved to, and each file's size, mtime and sha256 (from the
hub's LFS metadata, or computed once).  The probe compares sizes and mtimes only, so a no-op on a
terabyte moves and hashes nothing; a fetch with `verify` hashes everything and fetches again only
the files that differ.  A change made behind the manifest's back without touching size or mtime
goes unnoticed until then: that is the price of not hashing 1 TB on every run.

The hub is spoken to by the real huggingface_hub client, in a tool venv of its own (HF_PIN), which
honours HF_ENDPOINT; its transfer writes into NAME.part files, so a run cut mid-file resumes there
(the client's own snapshot_download deletes its partial files when it fails).  The token comes with
the action and goes only into that client's environment.
"""
import hashlib
import json
import os
import subprocess
import time

from specops.agent import safefs
from specops.agent.host import ActionError, clean, run_streamed, say, sha256_file
from specops.layout import HF_PIN, TOOLS_DIR, WEIGHTS_DIR

MARGIN = 0.02          # free space kept beyond what the fetch needs, as a fraction of it ...
MARGIN_MIN = 64 << 20  # ... and at least this many bytes
HF_SCRIPT = r"""
import fnmatch, json, os, sys
from concurrent.futures import ThreadPoolExecutor
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub import constants
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers
constants.DOWNLOAD_CHUNK_SIZE = 1 << 20  # what a cut loses at most (the client's default: 10 MiB)
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
spec = json.load(sys.stdin)
api = HfApi()
try:
    if sys.argv[1] == "info":
        info = api.model_info(spec["repo"], revision=spec["revision"], files_metadata=True)
        pats = spec.get("allow_patterns") or ["*"]
        files = []
        for s in info.siblings:
            if not any(fnmatch.fnmatch(s.rfilename, p) for p in pats):
                continue
            size, sha = s.size, s.lfs.sha256 if s.lfs else None
            if size is None:  # a hub (or mirror) that lists no sizes: ask each file's headers
                meta = get_hf_file_metadata(hf_hub_url(spec["repo"], s.rfilename, revision=info.sha))
                size = meta.size
                # an LFS file's etag is its sha256 (a plain git file's is a 40-digit git hash)
                sha = sha or (meta.etag if meta.etag and len(meta.etag) == 64 else None)
            files.append({"name": s.rfilename, "size": size, "sha256": sha})
        print(json.dumps({"commit": info.sha, "files": files}))
    else:
        # huggingface_hub's own transfer (http_get: its headers, retries, Range within a run), into
        # NAME.part files that outlive the run: the client deletes its partial files on failure,
        # so a cut run could not resume from them.
        def one(f):
            path = os.path.join(spec["dest"], f["name"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".part", "ab") as out:
                have = out.tell()
                if have > f["size"]:
                    out.truncate(0)
                    have = 0
                if have < f["size"]:
                    http_get(hf_hub_url(spec["repo"], f["name"], revision=spec["commit"]), out, resume_size=have,
                             headers=build_hf_headers(), expected_size=f["size"])
            os.replace(path + ".part", path)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, spec["files"]))
except GatedRepoError:
    sys.exit("gated")
except RepositoryNotFoundError:
    sys.exit("no such repository")
except RevisionNotFoundError:
    sys.exit("no such revision")
"""


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
    partial = {}  # a cut push's NAME.part files: where to resume
    for root, _, files in os.walk(dest) if os.path.isdir(dest) else ():
        for f in files:
            if f.endswith(".part"):
                rel = os.path.relpath(os.path.join(root, f), dest)[:-len(".part")]
                partial[rel] = os.lstat(os.path.join(root, f)).st_size
    return {"manifest": m, "differ": differ, "free": _free(dest), "partial": partial}


def _free(path):
    while path and not os.path.isdir(path):
        path = os.path.dirname(path)
    st = os.statvfs(path or "/")
    return st.f_bavail * st.f_frsize


def _write_manifest(dest, manifest):
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


def _tool_python(req):
    """The pinned huggingface_hub in a venv of its own, made once."""
    venv = os.path.join(TOOLS_DIR, "hf-" + HF_PIN)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(os.path.join(venv, ".complete")):
        safefs.make_dir(TOOLS_DIR, 0o755, 0, 0)
        run_streamed(["python3", "-m", "venv", "--clear", venv], "tool venv " + venv)
        run_streamed([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *req.pip_args,
                      "huggingface_hub==" + HF_PIN], "install huggingface_hub " + HF_PIN)
        open(os.path.join(venv, ".complete"), "w").close()
    return python


def _hub(python, req, mode, spec):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    if req.endpoint:
        env["HF_ENDPOINT"] = req.endpoint
    if req.token:
        env["HF_TOKEN"] = req.token
    return subprocess.Popen([python, "-I", "-c", HF_SCRIPT, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, universal_newlines=True), json.dumps(spec)


def _ask(python, req, mode, spec, progress=None):
    proc, data = _hub(python, req, mode, spec)
    proc.stdin.write(data)
    proc.stdin.close()
    while proc.poll() is None:
        if progress:
            progress()
        time.sleep(1)
    out, err = proc.stdout.read(), proc.stderr.read()
    if proc.returncode != 0:
        last = clean(err.strip().splitlines()[-1] if err.strip() else "exit %d" % proc.returncode)
        where = "%s@%s" % (req.repo, req.revision)
        if last == "gated":
            raise ActionError("%s is gated: %s" % (req.repo, "the token was refused" if req.token else
                              "set the service's env_secret %s to a token with access" % req.token_env))
        raise ActionError("hub %s: %s" % (where, last))
    return out


def _size(path):
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _on_disk(dest):
    """Bytes under dest, the client's partial downloads included."""
    total = 0
    for root, dirs, files in os.walk(dest):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def record(req, allowed):
    """Answer a protocol.RecordWeights: after a push from the controller, the manifest of `dest`
    (the pushed files hashed now, the others' hashes kept)."""
    old = (read_manifest(req.dest) or {}).get("files") or {}
    files = {}
    for name, size in sorted(req.files.items()):
        path = os.path.join(req.dest, name)
        st = os.lstat(path)
        if st.st_size != size:
            raise ActionError("%s: %d bytes, the controller's copy has %d" % (path, st.st_size, size))
        known = old.get(name) or {}
        same = known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns and name not in req.pushed
        files[name] = {"size": size, "mtime_ns": st.st_mtime_ns, "sha256": known["sha256"] if same else sha256_file(path)}
    _write_manifest(req.dest, {"dest": req.dest, "source": req.source, "commit": None, "files": files,
                               "fetched": time.time()})
    return {"files": len(files), "hashed": len(req.pushed)}


def fetch(req, allowed):
    """Answer a protocol.FetchWeights: the files the source lists, at the commit it resolves to."""
    safefs.make_dir(req.dest, 0o755, 0, 0, allowed=allowed)
    python = _tool_python(req)
    info = json.loads(_ask(python, req, "info", {"repo": req.repo, "revision": req.revision,
                                                  "allow_patterns": req.allow_patterns}))
    old = (read_manifest(req.dest) or {}).get("files") or {}
    missing = []
    for f in info["files"]:
        path = os.path.join(req.dest, f["name"])
        try:
            st = os.lstat(path)
        except OSError:
            missing.append(f)
            continue
        known = old.get(f["name"])
        same = st.st_size == f["size"] and known and known["size"] == st.st_size and known["mtime_ns"] == st.st_mtime_ns
        if req.verify or not same:
            want = f["sha256"] or (known or {}).get("sha256")
            if st.st_size != f["size"] or not want or sha256_file(path) != want:
                say("  %s differs: fetched again" % f["name"])
                os.unlink(path)
                missing.append(f)
    need = sum((f["size"] or 0) - _size(os.path.join(req.dest, f["name"] + ".part")) for f in missing)
    free = _free(req.dest)
    if need and free < need + max(MARGIN * need, MARGIN_MIN):
        raise ActionError("not enough disk for %s@%s in %s: need %.1f MiB (+%.0f MiB margin), %.1f MiB free"
                          % (req.repo, req.revision, req.dest, need / 2**20, max(MARGIN * need, MARGIN_MIN) / 2**20,
                             free / 2**20))
    before, t0, last = _on_disk(req.dest), time.time(), [0.0]

    def progress():
        now = time.time()
        if now - last[0] >= 2:
            last[0] = now
            got = _on_disk(req.dest) - before
            rate = got / max(now - t0, 1e-3)
            eta = (need - got) / rate if rate > 0 else 0
            say("  weights %s: %.1f/%.1f MiB, %.1f MiB/s, ETA %.0fs" % (req.repo, got / 2**20, need / 2**20,
                                                                       rate / 2**20, max(eta, 0)))
    if missing:
        _ask(python, req, "download", {"repo": req.repo, "commit": info["commit"], "dest": req.dest,
                                       "files": missing}, progress)
    moved = max(_on_disk(req.dest) - before, 0)
    files = {}
    for f in info["files"]:
        path = os.path.join(req.dest, f["name"])
        st = os.lstat(path)
        fetched = f in missing
        digest = sha256_file(path) if fetched or not (old.get(f["name"]) or {}).get("sha256") else old[f["name"]]["sha256"]
        if f["sha256"] and digest != f["sha256"]:
            raise ActionError("%s: sha256 %s, the hub says %s" % (path, digest[:12], f["sha256"][:12]))
        files[f["name"]] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    manifest = {"dest": req.dest, "source": req.source, "commit": info["commit"], "files": files,
                "fetched": time.time()}
    _write_manifest(req.dest, manifest)
    say("  weights %s@%s (%s): %d file(s), %.1f MiB moved" % (req.repo, req.revision, info["commit"][:12],
                                                             len(files), moved / 2**20))
    return {"commit": info["commit"], "moved": moved, "fetched": [f["name"] for f in missing]}

