"""A Hugging Face hub, asked through the real huggingface_hub client (HF_PIN) in a tool venv of
its own: what a revision holds (its commit, each file's size and LFS sha256, or a plain git
file's blob sha1), and the transfer of files into NAME.part files beside their place.

The client's own snapshot_download deletes its partial files when it fails, so a cut run could
not resume from them: the transfer is its http_get (its headers, its retries with Range within
a run) writing into .part files that outlive the run, each an fd the agent opened
(agent/weights/__init__.py).  The token, when there is one, is put in the client's environment only; no
stored token of root's is used (HF_HOME is the venv's own).
"""
import json
import os
import stat

from specops.agent.converge import installs
from specops.agent.weights import weightsdir
from specops.agent.host import ActionError, clean, run_owned, user_name
from specops.layout import HF_PIN

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
        for s in info.siblings:  # all names first: nothing is asked of a listing that lies
            if s.rfilename.startswith("/") or {"", ".", ".."} & set(s.rfilename.split("/")):
                sys.exit("refusing the file name %r from the source: it would leave the weights directory"
                         % s.rfilename)
        for s in info.siblings:
            if not any(fnmatch.fnmatch(s.rfilename, p) for p in pats):
                continue
            size, sha, blob = s.size, s.lfs.sha256 if s.lfs else None, None if s.lfs else s.blob_id
            if size is None:  # a hub (or mirror) that lists no sizes: ask each file's headers
                meta = get_hf_file_metadata(hf_hub_url(spec["repo"], s.rfilename, revision=info.sha))
                size = meta.size
                # an LFS file's etag is its sha256, a plain git file's its 40-digit git blob sha1
                sha = sha or (meta.etag if meta.etag and len(meta.etag) == 64 else None)
                blob = blob or (meta.etag if meta.etag and len(meta.etag) == 40 and not sha else None)
            files.append({"name": s.rfilename, "size": size, "sha256": sha, "blob": blob})
        print(json.dumps({"commit": info.sha, "files": files}))
    else:
        # huggingface_hub's own transfer (http_get: its headers, retries, Range within a run), into
        # NAME.part files that outlive the run: the client deletes its partial files on failure,
        # so a cut run could not resume from them.  The agent opened each .part below the weights
        # directory and hands it over as an fd: this process writes nowhere by path.
        def one(f):
            with os.fdopen(f["fd"], "ab") as out:
                have = os.fstat(out.fileno()).st_size
                if have < f["size"]:
                    http_get(hf_hub_url(spec["repo"], f["name"], revision=spec["commit"]), out, resume_size=have,
                             headers=build_hf_headers(), expected_size=f["size"])
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, spec["files"]))
except GatedRepoError:
    sys.exit("gated")
except RepositoryNotFoundError:
    sys.exit("no such repository")
except RevisionNotFoundError:
    sys.exit("no such revision")
"""


def tool_python(req):
    """The pinned huggingface_hub in a venv of its own, made once."""
    return installs.tool_venv("hf-" + HF_PIN, "huggingface_hub==" + HF_PIN, req.pip_args)


def ask(python, req, mode, spec, progress=None, pass_fds=()):
    """Run the hub script (stopped with us if we are interrupted); poll `progress` meanwhile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    # No token but the one given: not root's stored one (HF_HOME is the tool venv's own).
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               HF_HOME=os.path.join(os.path.dirname(os.path.dirname(python)), "hf-home"))
    if req.endpoint:
        env["HF_ENDPOINT"] = req.endpoint
    if req.token:
        env["HF_TOKEN"] = req.token
    rc, out, err = run_owned([python, "-I", "-c", HF_SCRIPT, mode], json.dumps(spec), env, progress, pass_fds)
    if rc != 0:
        last = clean(err.strip().splitlines()[-1] if err.strip() else "exit %d" % rc)
        if last == "gated":
            raise ActionError("%s is gated: %s" % (req.repo, "the token was refused" if req.token else
                              "set the service's env_secret %s to a token with access" % req.token_env))
        raise ActionError("hub %s@%s: %s" % (req.repo, req.revision, last))
    return out


def download(req, python, dfd, commit, stale, progress):
    """The hub client writes each file into its NAME.part, opened here (below dfd, never through a
    link) and handed to it as an fd; each one that is whole is renamed into place here, also when
    others failed (the next run resumes those)."""
    parts = []  # (directory fd, base name, .part fd, size)
    try:
        for f in stale:
            pfd, base = weightsdir.parent_at(dfd, f["name"], create=True)
            parts.append((pfd, base, None, f["size"]))
            fd = os.open(base + ".part", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o644, dir_fd=pfd)
            parts[-1] = (pfd, base, fd, f["size"])
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise ActionError("%s.part is not a file of its own" % os.path.join(req.dest, f["name"]))
            if st.st_uid != 0 or st.st_mode & 0o022:  # not what the agent made: never written into
                raise ActionError("%s.part is %s's (mode %o), not root's: refused; remove it to fetch again"
                                  % (os.path.join(req.dest, f["name"]), user_name(st.st_uid), stat.S_IMODE(st.st_mode)))
            if st.st_size > f["size"]:
                os.ftruncate(fd, 0)
        todo = [dict(f, fd=fd) for f, (_, _, fd, _) in zip(stale, parts)]
        try:
            ask(python, req, "download", {"repo": req.repo, "commit": commit, "files": todo}, progress,
                [p[2] for p in parts])
        finally:
            for pfd, base, fd, size in parts:
                if os.fstat(fd).st_size == size:
                    os.rename(base + ".part", base, src_dir_fd=pfd, dst_dir_fd=pfd)
    finally:
        for pfd, _, fd, _ in parts:
            for each in (fd, pfd):
                if each is not None:
                    os.close(each)
