"""Idempotent operations: the engine's contract, in one place.

An op states a desired state.  ``wants()`` says which facts it needs (they are
gathered for all ops in one probe); ``plan(facts, ctx)`` compares, returns a
Change with the actions that close the gap (none when there is no gap) and
updates the in-memory facts so later ops see the state as it will be.
"""
from __future__ import annotations

import base64
import difflib
import hashlib
import json
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecopsError, UsageError

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
_jinja = None  # built on first render: most runs of a no-op deploy never import Jinja2's 40 ms


class PlanError(SpecopsError):
    """The desired state cannot be reached from these facts."""


@dataclass
class Change:
    role: str
    target: str
    changed: bool
    summary: str
    diff: str = ""
    actions: list = field(default_factory=list)
    notify: list = field(default_factory=list)
    warning: str = ""  # shown even when nothing changes
    uploads: list = field(default_factory=list)  # (local path, remote path): pushed before the batch

    def record(self, host: str) -> dict:
        return {"host": host, "role": self.role, "target": self.target, "changed": self.changed,
                "summary": self.summary, "diff": self.diff, "warning": self.warning}


class Facts:
    """The probe's answer, with the accessors ops need."""

    def __init__(self, data: dict):
        self.data = data

    def file(self, key: str) -> dict:
        return self.data["files"][key]

    def unit(self, name: str) -> dict:
        return self.data["units"].get(name, {})

    def venv(self, path: str) -> dict:
        return self.data["venvs"].get(path, {"exists": False})

    def listing(self, directory: str) -> dict[str, int]:
        """name → size of the files in a directory."""
        return self.data.get("listings", {}).get(directory, {})

    def check(self, name: str) -> int:
        return self.data["checks"][name]

    @property
    def gpu(self) -> dict:
        return self.data.get("gpu", {"present": False})


@dataclass
class Context:
    host: str
    check: bool
    notified: list = field(default_factory=list)
    release_dir: str | None = None  # where replaced files are backed up (releases)


def merge_wants(parts: list[dict]) -> dict:
    out: dict[str, Any] = {"files": [], "content": {}, "units": [], "venvs": [], "checks": {},
                           "gpu": False, "listdirs": []}
    for w in parts:
        for k in ("files", "units", "venvs", "listdirs"):
            out[k] += [x for x in w.get(k, []) if x not in out[k]]
        out["content"].update(w.get("content", {}))
        out["checks"].update(w.get("checks", {}))
        out["gpu"] = out["gpu"] or w.get("gpu", False)
        if w.get("lock"):
            out["lock"] = w["lock"]
    return out


def pkg_path(venv: str, rel: str) -> str:
    """A path inside an installed package, resolved on the host by the venv's interpreter."""
    return f"pkg:{venv}:{rel}"


def unified_diff(old: bytes | None, new: bytes, name: str) -> str:
    if old is None:
        old = b""
    try:
        a, b = old.decode().splitlines(True), new.decode().splitlines(True)
    except UnicodeDecodeError:
        return f"binary {name}: {len(old)} → {len(new)} bytes\n"
    return "".join(difflib.unified_diff(a, b, f"{name} (host)", f"{name} (desired)", n=2))


class Op:
    role = ""
    notify: tuple = ()

    def wants(self) -> dict:
        return {}

    def plan(self, facts: Facts, ctx: Context) -> Change:
        raise NotImplementedError

    def _change(self, target: str, summary: str, actions=(), diff="", notify=None) -> Change:
        if notify is None:
            notify = self.notify if actions else ()
        return Change(self.role, target, bool(actions), summary, diff, list(actions), list(notify))


class Directory(Op):
    def __init__(self, path: str, mode: str = "0755", owner: str = "root", group: str = "root"):
        self.path, self.mode, self.owner, self.group = path, mode, owner, group

    def wants(self):
        return {"files": [self.path]}

    def plan(self, facts, ctx):
        f = facts.file(self.path)
        if f["exists"] and f.get("type") != "dir":
            raise PlanError(f"{self.path} exists and is not a directory")
        same = f["exists"] and (f["mode"], f["owner"], f["group"]) == (self.mode, self.owner, self.group)
        facts.data["files"][self.path] = {**f, "exists": True, "type": "dir", "mode": self.mode,
                                          "owner": self.owner, "group": self.group}
        if same:
            return self._change(self.path, "ok")
        verb = "create directory" if not f["exists"] else f"directory attrs {f['mode']} → {self.mode}"
        return self._change(self.path, verb, [{"kind": "mkdir", "path": self.path, "mode": self.mode,
                                               "owner": self.owner, "group": self.group, "desc": verb}])


class File(Op):
    """A whole file: content, mode, owner.  Writes go stage → validate → backup → rename."""

    def __init__(self, path: str, content: bytes | str, mode: str = "0644", owner: str = "root",
                 group: str = "root", validate: list[str] | None = None, notify=(),
                 secret: bool = False, label: str | None = None, validator: str | None = None):
        self.path = path
        self.content = content.encode() if isinstance(content, str) else content
        self.mode, self.owner, self.group = mode, owner, group
        self.validate, self.notify, self.secret = validate, tuple(notify), secret
        self.label = label or path
        self.validator = validator or (" ".join(validate[:2]) if validate else None)
        self.sha256 = hashlib.sha256(self.content).hexdigest()

    def wants(self):
        # Old content comes back only when it differs, for the diff.
        return {"files": [self.path], "content": {self.path: self.sha256}}

    def plan(self, facts, ctx):
        f = facts.file(self.path)
        if f.get("unresolved"):
            raise PlanError(f"{self.label}: cannot resolve {self.path.split(':')[-1]}: "
                            f"the package is not installed in {self.path.split(':')[1]}")
        real = f["path"]
        if f["exists"] and f.get("type") != "file":
            raise PlanError(f"{real} exists and is not a regular file")
        facts.data["files"][self.path] = {**f, "exists": True, "type": "file", "sha256": self.sha256,
                                          "mode": self.mode, "owner": self.owner or f.get("owner"),
                                          "group": self.group or f.get("group"),
                                          "changed_now": f.get("sha256") != self.sha256}
        if f["exists"] and f["sha256"] == self.sha256:
            if all(want is None or f[k] == want for k, want in
                   (("mode", self.mode), ("owner", self.owner), ("group", self.group))):
                return self._change(self.label, "ok")
            summary = f"attrs {f['mode']} {f['owner']}:{f['group']} → {self.mode} {self.owner}:{self.group}"
            return self._change(self.label, summary, [{"kind": "attrs", "path": real, "mode": self.mode,
                                                       "owner": self.owner, "group": self.group,
                                                       "desc": f"{self.label}: {summary}"}], notify=[])
        old = base64.b64decode(f["content_b64"]) if "content_b64" in f else None
        if self.secret:
            diff = f"--- {self.label}\n+++ {self.label}\n(secret content: not shown)\n"
        elif f["exists"] and old is None:
            diff = f"{self.label}: content differs ({f['size']} → {len(self.content)} bytes; too large to diff)\n"
        else:
            diff = unified_diff(old, self.content, self.label)
        summary = "create" if not f["exists"] else "update"
        backup = posixpath.join(ctx.release_dir, "previous", real.lstrip("/")) if ctx.release_dir and f["exists"] else None
        action = {"kind": "write", "path": real, "data": base64.b64encode(self.content).decode(),
                  "mode": self.mode, "owner": self.owner, "group": self.group,
                  "validate": self.validate, "validator": self.validator, "label": self.label,
                  "backup": backup, "desc": f"{summary} {self.label}"}
        return self._change(self.label, summary, [action], diff)


def render(template: str, **vars: Any) -> str:
    global _jinja
    import jinja2
    if _jinja is None:
        _jinja = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                                    undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                    trim_blocks=True, lstrip_blocks=True)
    try:
        return _jinja.get_template(template).render(**vars)
    except jinja2.UndefinedError as e:
        raise UsageError(f"templates/{template}: {e.message}") from None
    except jinja2.TemplateError as e:
        raise UsageError(f"templates/{template}: {e}") from None


def template(path: str, name: str, vars: dict, **kw: Any) -> File:
    """A File whose content is a Jinja2 template rendered with StrictUndefined."""
    return File(path, render(name, **vars), **kw)


STATE_FILE = "/var/lib/specops/state.json"


def host_state(facts: Facts) -> dict:
    """specops's own record on the host (bytecode purges), from the probe."""
    f = facts.file(STATE_FILE)
    if not f.get("exists") or "content_b64" not in f:
        return {}
    try:
        return json.loads(base64.b64decode(f["content_b64"]))
    except ValueError:
        return {}


STATE_WANTS = {"files": [STATE_FILE], "content": {STATE_FILE: "always"}}


class PurgeBytecode(Op):
    """No cached bytecode may outlive a managed module source.

    Python trusts a .pyc whose recorded source size and mtime match (so a same-size
    edit that keeps the mtime runs the old code), and never checks an unchecked-hash
    .pyc at all.  So every <module>.*.pyc is removed whenever the source is replaced,
    when specops has no purge on record for the current content, or when a .pyc is
    older than the last purge.  Bytecode written by the restarted service is newer
    than the purge, so a second run does nothing.
    """

    def __init__(self, source: str, label: str | None = None, notify=()):
        self.source, self.label, self.notify = source, label or source, tuple(notify)

    def wants(self):
        return merge_wants([{"files": [self.source]}, STATE_WANTS])

    def plan(self, facts, ctx):
        f = facts.file(self.source)
        if f.get("unresolved") or not f.get("exists"):
            return self._change(f"bytecode of {self.label}", "ok")
        record = host_state(facts).get("purges", {}).get(f["path"])
        pycs = f.get("pycache", [])
        if f.get("changed_now"):
            reason = "source replaced"
        elif not record or record["sha256"] != f["sha256"]:
            reason = "no purge on record for this content"
        elif any(p["mtime"] < record["purged_at"] for p in pycs):
            reason = "bytecode older than the last purge"
        else:
            return self._change(f"bytecode of {self.label}", "ok")
        names = ", ".join(p["name"] for p in pycs) or "none cached yet"
        return self._change(f"bytecode of {self.label}", f"purge ({reason}): {names}", [{
            "kind": "purge", "path": f["path"], "sha256": f["sha256"],
            "desc": f"purge bytecode of {self.label}"}])


class RunningCode(Op):
    """A running service must have started after every file it runs from last changed."""

    def __init__(self, service: str, sources: list[str]):
        self.service, self.sources = service, sources
        self.notify = (f"restart:{service}",)

    def wants(self):
        return merge_wants([{"units": [self.service], "files": self.sources}, STATE_WANTS])

    def plan(self, facts, ctx):
        target = f"running code of {self.service}"
        u = facts.unit(self.service)
        started = u.get("ExecMainStartTimestamp")
        if u.get("ActiveState") != "active" or not started or f"restart:{self.service}" in ctx.notified:
            return self._change(target, "ok")
        purges = host_state(facts).get("purges", {})
        events = []
        for key in self.sources:
            f = facts.file(key)
            if f.get("exists") and f.get("mtime"):
                events.append((f["mtime"], f["path"]))
            if f.get("path") in purges:
                events.append((purges[f["path"]]["purged_at"], f"the bytecode purge of {f['path']}"))
        newest = max(events, default=None)
        if not newest or newest[0] <= started:
            return self._change(target, "ok")
        return Change(self.role, target, True, f"running old code: started before {newest[1]} changed; restart",
                      notify=list(self.notify))


class Absent(Op):
    def __init__(self, path: str, notify=()):
        self.path, self.notify = path, tuple(notify)

    def wants(self):
        return {"files": [self.path]}

    def plan(self, facts, ctx):
        f = facts.file(self.path)
        facts.data["files"][self.path] = {"path": f.get("path"), "exists": False}
        if not f["exists"]:
            return self._change(self.path, "ok")
        backup = posixpath.join(ctx.release_dir, "previous", f["path"].lstrip("/")) if ctx.release_dir else None
        return self._change(self.path, "remove", [{"kind": "remove", "path": f["path"], "backup": backup,
                                                   "desc": f"remove {self.path}"}],
                            diff=f"--- {self.path}\n+++ /dev/null\n")


def dotted_set(doc: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = doc
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[last] = value


def dotted_get(doc: dict, dotted: str, default: Any = None) -> Any:
    node: Any = doc
    for p in dotted.split("."):
        if not isinstance(node, dict) or p not in node:
            return default
        node = node[p]
    return node


class JsonKeys(Op):
    """Set keys (dotted paths) in an existing JSON file, leaving the rest as it is."""

    def __init__(self, path: str, keys: dict[str, Any], mode: str | None = None, notify=()):
        self.path, self.keys, self.mode, self.notify = path, keys, mode, tuple(notify)

    def wants(self):
        return {"files": [self.path], "content": {self.path: "always"}}

    def current(self, facts: Facts) -> dict:
        f = facts.file(self.path)
        if not f["exists"]:
            raise PlanError(f"{self.path}: file not found on the host")
        try:
            doc = json.loads(base64.b64decode(f["content_b64"]))
        except (KeyError, ValueError) as e:
            raise PlanError(f"{self.path}: not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise PlanError(f"{self.path}: the top level is not a JSON object")
        return doc

    def plan(self, facts, ctx):
        f = facts.file(self.path)
        doc = self.current(facts)
        if all(dotted_get(doc, k, object()) == v for k, v in self.keys.items()):
            return self._change(self.path, "ok")
        for k, v in self.keys.items():
            dotted_set(doc, k, v)
        new = (json.dumps(doc, indent=2) + "\n").encode()
        write = File(self.path, new, mode=self.mode or f["mode"], owner=f["owner"], group=f["group"],
                     notify=self.notify)
        write.role = self.role
        change = write.plan(facts, ctx)
        facts.data["files"][self.path]["content_b64"] = base64.b64encode(new).decode()
        keys = ", ".join(self.keys)
        change.summary = f"set {keys}"
        return change


UNIT_DIR = "/etc/systemd/system"


def unit_file(name: str, content: str, notify_restart: bool = True) -> File:
    """A systemd unit, verified by systemd-analyze on the host before it is renamed into place."""
    notify = ["daemon-reload"] + ([f"restart:{name}"] if notify_restart else [])
    return File(f"{UNIT_DIR}/{name}.service", content, mode="0644",
                validate=["systemd-analyze", "verify", "{}"], notify=notify)


class Service(Op):
    """A systemd service's state: started or stopped, enabled or not."""

    def __init__(self, name: str, state: str = "started", enabled: bool | None = True):
        self.name, self.state, self.enabled = name, state, enabled

    def wants(self):
        return {"units": [self.name]}

    def plan(self, facts, ctx):
        u = facts.unit(self.name)
        actions, said = [], []
        restarting = f"restart:{self.name}" in ctx.notified
        active = u.get("ActiveState") in ("active", "activating", "reloading")
        if self.enabled is not None and u.get("UnitFileState") != ("enabled" if self.enabled else "disabled"):
            verb = "enable" if self.enabled else "disable"
            # --no-reload: enabling is a symlink; a changed unit gets the daemon-reload handler.
            actions.append({"kind": "run", "cmd": ["systemctl", verb, "--quiet", "--no-reload", self.name],
                            "desc": f"{verb} {self.name}"})
            said.append(verb)
        if self.state == "started" and not active and not restarting:
            actions.append({"kind": "run", "cmd": ["systemctl", "start", self.name],
                            "desc": f"start {self.name}"})
            said.append("start")
        elif self.state == "stopped" and active:
            actions.append({"kind": "run", "cmd": ["systemctl", "stop", self.name],
                            "desc": f"stop {self.name}"})
            said.append("stop")
        return self._change(f"service {self.name}", ", ".join(said) or "ok", actions)


class Command(Op):
    """A guarded command: skipped when `creates` exists or the `unless` check succeeds."""

    def __init__(self, cmd: str | list, desc: str, unless: str | None = None,
                 creates: str | None = None, notify=()):
        self.cmd, self.desc, self.unless, self.creates = cmd, desc, unless, creates
        self.notify = tuple(notify)
        self.check_id = "cmd:" + hashlib.sha256(json.dumps([cmd, unless]).encode()).hexdigest()[:12]

    def wants(self):
        w: dict = {}
        if self.unless:
            w["checks"] = {self.check_id: self.unless}
        if self.creates:
            w["files"] = [self.creates]
        return w

    def plan(self, facts, ctx):
        if self.creates and facts.file(self.creates)["exists"]:
            return self._change(self.desc, "ok")
        if self.unless and facts.check(self.check_id) == 0:
            return self._change(self.desc, "ok")
        if self.creates:
            facts.data["files"][self.creates] = {"path": self.creates, "exists": True}
        return self._change(self.desc, "run", [{"kind": "run", "cmd": self.cmd, "desc": self.desc}])


HANDLER_ORDER = ("daemon-reload",)


def handler_actions(notified: list[str]) -> list[dict]:
    """Each notified handler once; daemon-reload before any restart."""
    names = list(dict.fromkeys(notified))
    names.sort(key=lambda n: (0 if n in HANDLER_ORDER else 1))
    actions = []
    for n in names:
        if n == "daemon-reload":
            actions.append({"kind": "run", "cmd": ["systemctl", "daemon-reload"], "desc": "handler: daemon-reload"})
        elif n.startswith("restart:"):
            svc = n.split(":", 1)[1]
            actions.append({"kind": "run", "cmd": ["systemctl", "restart", svc], "desc": f"handler: restart {svc}"})
        else:
            raise SpecopsError(f"unknown handler {n!r}")
    return actions
