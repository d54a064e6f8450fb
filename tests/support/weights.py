"""Weights from the sandbox hub (tests/conftest.py's `hub` fixture): a service that fetches them,
a deploy of it with its --json report, and the sha256 of what the hub serves and a host holds; and,
without a fleet, a weights directory as a fetch leaves it (fetched)."""
import hashlib
import os
import time
import types

from sandbox import hub as hub_mod
from sandbox.provision import sandbox_service
from specops.agent import weights
from support.files import load_json

TARGET, DRAFT = "/models/hub-llama", "/models/hub-llama-eagle3"
INDEX = {}  # the hosts' package index, set by the `hub` fixture: their weights tool venv installs from it


def hub_service(hub, repo="sandbox/tiny-llama", **over):
    return sandbox_service(**{
        "model_path": TARGET, "speculative": {"algorithm": "EAGLE3", "draft_model_path": DRAFT, "num_steps": 3,
                                              "eagle_topk": 1, "num_draft_tokens": 4},
        "weights": {"source": "hf", "repo": repo, "revision": "main", "endpoint": hub.url},
        "draft_weights": {"source": "hf", "repo": "sandbox/tiny-llama-eagle3", "revision": "main",
                          "endpoint": hub.url}, **over})


def run(sandbox, name, svc, *args, host_vars=None, **kw):
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    inv = sandbox.inventory({name: {"services": [svc], **(host_vars or INDEX)}})
    res = sandbox.inv(*(args or ("deploy",)), "--host", name, "--json", str(report), inventory=inv, **kw)
    return res, (load_json(report)["hosts"][name] if report.exists() else None)


def hub_sha256(repo):
    return {f: hashlib.sha256(d).hexdigest() for f, d in hub_mod.REPOS[repo].items()}


def host_sha256(h, path, names):
    out = h.run("sh", "-c", "cd %s && sha256sum %s" % (path, " ".join(names))).stdout.split("\n")
    return {line.split()[1]: line.split()[0] for line in out if line.strip()}


def fetched(tmp_path, monkeypatch, names=("a.safetensors", "config.json")):
    """A directory of root's with a manifest of its files, as a fetch leaves it."""
    monkeypatch.setattr(weights, "WEIGHTS_DIR", str(tmp_path / "manifests"))
    dest = tmp_path / "model"
    dest.mkdir(mode=0o755)
    for n in names:
        (dest / n).write_bytes(n.encode() * 10)
    files = {n: {"size": (dest / n).stat().st_size, "mtime_ns": (dest / n).stat().st_mtime_ns,
                 "sha256": hashlib.sha256(n.encode() * 10).hexdigest()} for n in names}
    weights.write_manifest(str(dest), {"dest": str(dest), "source": {}, "commit": "c1", "files": files})
    return dest


def fetch_again(dest, verify):
    """weights._fetch into `dest` as the agent runs it (the caller stands in for the hub: ask,
    download, tool_python); its result."""
    from specops.agent.weights import weightsdir
    req = types.SimpleNamespace(repo="o/n", revision="main", allow_patterns=None, dest=str(dest), verify=verify,
                                source={})
    dfd = weightsdir.open_dest(str(dest), ())
    try:
        return weights._fetch(req, dfd)
    finally:
        os.close(dfd)
