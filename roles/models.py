"""The target's and the draft's weights on the host, before anything else of a service changes.

With a `weights:` (target, into model_path) or `draft_weights:` (into speculative.draft_model_path)
source, they are brought in: `hf`, the host fetches them itself from a Hugging Face hub (the real
huggingface_hub client, HF_ENDPOINT for a company mirror, HF_TOKEN from the service's env_secret);
`controller`, they are pushed from a directory on the controller, a cut file resumed; `peer`,
they are copied host to host from another box of the inventory (rsync over SSH with a key made
for that one copy).  Either way
the host keeps a manifest; a re-run compares sizes and mtimes against it and moves nothing.  Without a source, the
weights must already be there: a one-line error names the path otherwise.
"""
import os
from specops.inventory import schema
from urllib.parse import urlsplit

from specops.remote import peergrant
from specops import protocol
from specops.errors import UsageError
from specops.ops import Context, Facts, Op, PlanError
from specops.kinds import of_kind
from specops.kinds.sglang import weight_sources

from specops.sglang.indexes import pip_sources

NAME = "models"
VARS = schema.INDEX_VARS  # the host vars it reads
AFTER = ("patch_check", "system_packages")  # the roles it runs after, when they run
REPROBE = True  # later roles read the fetched config.json files


class Present(Op):
    """Weights with no source: they are there (their config.json), or the run stops here."""

    def __init__(self, svc, setting, path):
        self.services, self.setting, self.path = (svc["name"],), setting, path
        self.config = f"{path.rstrip('/')}/config.json"

    def wants(self):
        return protocol.Probe(files=[self.config])

    def plan(self, facts: Facts, ctx: Context):
        fact = facts.file(self.config)
        # Only absence is ours to say: a link or an unsafe path is said, precisely, by the roles that read it.
        if not fact["exists"] or fact.get("type") == "dir":
            source = "weights" if self.setting == "model_path" else "draft_weights"
            raise PlanError(f"service {self.services[0]}: {self.setting} {self.path} has no config.json on the "
                            f"host; copy the weights there, or give the service a `{source}:` source")
        return self._change(f"weights in {self.path}", "ok")


class Fetched(Op):
    """Weights from a hub: in place as the manifest says (sizes and mtimes), else fetched."""

    def __init__(self, host, svc, path, source):
        self.services, self.path, self.source = (svc["name"],), path.rstrip("/"), source
        self.token_env = source.get("token_env", "HF_TOKEN")
        self.token = (svc.get("env_secret") or {}).get(self.token_env)
        self.pip = pip_sources(host)

    def wants(self):
        return protocol.Probe(weights=[self.path])

    def plan(self, facts: Facts, ctx: Context):
        have = facts.data["weights"][self.path]
        m = have["manifest"] or {}
        label = f"weights {self.source['repo']}@{self.source['revision']} in {self.path}"
        if m.get("source") == self.source and not have["differ"] and not ctx.verify_weights:
            return self._change(label, "ok")
        why = ("hash every file (--verify-weights)" if m.get("source") == self.source and not have["differ"]
               else f"{len(have['differ'])} file(s) changed on the host" if m.get("source") == self.source
               else "fetch" if not m else "fetch (the source changed)")
        return self._change(label, why, [protocol.FetchWeights(
            dest=self.path, repo=self.source["repo"], revision=self.source["revision"], source=self.source,
            allow_patterns=self.source.get("allow_patterns"), endpoint=self.source.get("endpoint"),
            token=self.token, token_env=self.token_env, pip_args=self.pip,
            verify=ctx.verify_weights, desc=f"{label}: {why}")])


MARGIN_MIN = 64 << 20  # free bytes a push leaves on the host's filesystem, at least


class Pushed(Op):
    """Weights from a directory on the controller: the files the manifest lacks or that differ
    are pushed (a cut one from where it stopped), then the host hashes them into the manifest."""

    def __init__(self, svc, path, source):
        self.services, self.path = (svc["name"],), path.rstrip("/")
        self.local = os.path.expanduser(source["path"])
        if not os.path.isdir(self.local):
            raise UsageError(f"service {svc['name']}: weights path {self.local} is not a directory on the controller")
        self.files = {}
        for root, dirs, names in os.walk(self.local):
            dirs.sort()
            for n in sorted(names):
                st = os.stat(os.path.join(root, n))
                self.files[os.path.relpath(os.path.join(root, n), self.local)] = [st.st_size, st.st_mtime_ns]
        self.source = {"source": "controller", "path": source["path"], "files": self.files}

    def wants(self):
        return protocol.Probe(weights=[self.path])

    def plan(self, facts: Facts, ctx: Context):
        have = facts.data["weights"][self.path]
        held = ((have["manifest"] or {}).get("files") or {})
        label = f"weights {self.local} (controller) in {self.path}"
        changed = [n for n, (size, _) in self.files.items()
                   if n in have["differ"] or (held.get(n) or {}).get("size") != size
                   or ((have["manifest"] or {}).get("source") or {}).get("files", {}).get(n) != self.files[n]]
        if not changed and (have["manifest"] or {}).get("source") == self.source:
            return self._change(label, "ok")
        # A file already whole on the host (a cut push had finished it) is not sent again: the
        # host hashes it against the controller's copy, and a difference fails the run and removes it.
        adopted = [n for n in changed if n not in held and have["present"].get(n) == self.files[n][0]]
        send = [n for n in changed if n not in adopted]
        offsets = {n: have["partial"].get(n, 0) if have["partial"].get(n, 0) < self.files[n][0] else 0 for n in send}
        need = sum(self.files[n][0] - offsets[n] for n in send)
        free = have["free"] - ctx.reserved.get(have["device"], 0)  # what an earlier push of this run takes
        if need + MARGIN_MIN > free:
            raise PlanError(f"not enough disk for {self.local} in {self.path}: need {need / 2**20:.1f} MiB "
                            f"(+{MARGIN_MIN >> 20} MiB margin), {free / 2**20:.1f} MiB free")
        ctx.reserved[have["device"]] = ctx.reserved.get(have["device"], 0) + need
        resumed = sum(offsets.values())
        from specops.agent.host import sha256_file  # only when weights are pushed: not every task's to import
        c = self._change(label, f"push {len(send)} file(s), {need / 2**20:.1f} MiB"
                         + (f" (resuming after {resumed / 2**20:.1f} MiB)" if resumed else "")
                         + (f"; {len(adopted)} already there, to be checked" if adopted else ""),
                         [protocol.RecordWeights(dest=self.path, source=self.source,
                                                 files={n: s for n, (s, _) in self.files.items()},
                                                 pushed=send + adopted,
                                                 expect={n: sha256_file(os.path.join(self.local, n))
                                                         for n in send + adopted},
                                                 desc=f"manifest of {self.path}")])
        c.uploads = [(os.path.join(self.local, n), f"{self.path}/{n}", offsets[n]) for n in send]
        return c


class Copied(Op):
    """Weights from another box of the inventory: in place as the manifest says, else copied host
    to host (specops/remote/peergrant.py: a key for that one copy, never the bytes through the controller)."""

    def __init__(self, host, svc, path, source, where):
        self.services, self.path = (svc["name"],), path.rstrip("/")
        self.peer = (host.inventory.hosts if host.inventory else {}).get(source["host"])
        if self.peer is None or self.peer.name == host.name:
            raise UsageError(f"{where}: the peer {source['host']!r} must be another host of the inventory")
        self.source = {"source": "peer", "host": source["host"], "path": source["path"]}
        self.copy = peergrant.PeerCopy(self.peer, source["path"], self.path, self.source,
                                      source.get("address"), source.get("port"))

    def wants(self):
        return protocol.Probe(weights=[self.path])

    def plan(self, facts: Facts, ctx: Context):
        have = facts.data["weights"][self.path]
        same = (have["manifest"] or {}).get("source") == self.source
        label = f"weights {self.peer.name}:{self.source['path']} (peer) in {self.path}"
        if same and not have["differ"] and not ctx.verify_weights:
            return self._change(label, "ok")
        why = ("compare every file with the peer's (--verify-weights)" if same and not have["differ"]
               else f"{len(have['differ'])} file(s) changed on the host: copy again" if same
               else "copy from the peer, host to host")
        self.copy.device = have["device"]
        self.copy.checksum = same and bool(have["differ"])
        c = self._change(label, why)
        c.copies = [self.copy]
        return c


def _source_op(host, svc, setting, path, source):
    where = f"{host.name}: service {svc['name']!r}: {'weights' if setting == 'model_path' else 'draft_weights'}"
    need = {"hf": ("repo", "revision"), "controller": ("path",), "peer": ("host", "path")}[source["source"]]
    missing = [k for k in need if not source.get(k)]
    if missing:
        raise UsageError(f"{where}: a {source['source']} source needs {' and '.join(need)} ({missing[0]} is missing)")
    if source["source"] == "peer":
        return Copied(host, svc, path, source, where)
    if source["source"] == "hf" and host.get("wheelhouse"):
        raise UsageError(f"{where}: an air-gapped host (wheelhouse) cannot install the hub client before its "
                         f"wheelhouse is pushed; bring the weights with a controller or peer source")
    parts = urlsplit(source.get("endpoint") or "")
    if parts.username or parts.password:
        raise UsageError(f"{where}: the endpoint must not carry credentials (they would show in logs); "
                         f"give the token as the service's env_secret {source.get('token_env', 'HF_TOKEN')}")
    return Fetched(host, svc, path, source) if source["source"] == "hf" else Pushed(svc, path, source)


def ops(host):
    out = []
    for svc in of_kind(host, "sglang"):
        for setting, path, source in weight_sources(svc):
            out.append(_source_op(host, svc, setting, path, source) if source else Present(svc, setting, path))
    return out
