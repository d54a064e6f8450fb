"""Ops on files: whole files (and templates), directories, absence, keys in a JSON file.

A write goes stage → validate → backup into the release → rename, on the host.
"""
from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from pathlib import Path
from typing import Any

from .. import memo, protocol
from ..errors import UsageError
from .base import Op, PlanError, unified_diff

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"  # package data
_jinja = None  # built on first render: a run that renders nothing new never imports Jinja2


def _backup(ctx, real: str) -> str | None:
    return posixpath.join(ctx.release_dir, "previous", real.lstrip("/")) if ctx.release_dir else None


class Directory(Op):
    def __init__(self, path: str, mode: str = "0755", owner: str = "root", group: str = "root"):
        self.path, self.mode, self.owner, self.group = path, mode, owner, group

    def wants(self):
        return protocol.Probe(files=[self.path])

    def plan(self, facts, ctx):
        f = facts.file(self.path)
        if f["exists"] and f.get("type") != "dir":
            raise PlanError(f"{self.path} exists and is not a directory")
        same = f["exists"] and (f["mode"], f["owner"], f["group"]) == (self.mode, self.owner, self.group)
        facts.assume_file(self.path, exists=True, type="dir", mode=self.mode, owner=self.owner, group=self.group)
        if same:
            return self._change(self.path, "ok")
        verb = "create directory" if not f["exists"] else f"directory attrs {f['mode']} → {self.mode}"
        step = f"create directory {self.path}" if not f["exists"] else f"{self.path}: {verb}"  # the host's step line
        return self._change(self.path, verb, [protocol.Mkdir(path=self.path, mode=self.mode, owner=self.owner,
                                                             group=self.group, desc=step)])


class File(Op):
    """A whole file: content, mode, owner.  `validate` is an argv run on the staged copy ({}).
    `own` says what of specops's own this file is ("specops's launcher"): its diff is then one
    line, never its body (the user reviews their own files' diffs, not specops's code)."""

    def __init__(self, path: str, content: bytes | str, mode: str = "0644", owner: str | None = "root",
                 group: str | None = "root", validate: list[str] | None = None, notify=(),
                 secret: bool = False, label: str | None = None, validator: str | None = None,
                 own: str | None = None):
        self.path = path
        self.content = content.encode() if isinstance(content, str) else content
        self.mode, self.owner, self.group = mode, owner, group
        self.validate, self.notify, self.secret, self.own = validate, tuple(notify), secret, own
        self.label = label or path
        self.validator = validator or (" ".join(validate[:2]) if validate else None)
        self.sha256 = hashlib.sha256(self.content).hexdigest()

    def wants(self):
        # Old content comes back only when it differs, for the diff; a secret's never does, nor
        # specops's own file's (its diff is one line).
        return protocol.Probe(files=[self.path], content={} if self.secret or self.own else {self.path: self.sha256})

    def plan(self, facts, ctx):
        f = facts.file(self.path)
        if f.get("unresolved"):
            raise PlanError(f"{self.label}: cannot resolve {self.path.split(':')[-1]}: "
                            f"the package is not installed in {self.path.split(':')[1]}")
        refuse_unsafe(f)
        if f["exists"] and f["sha256"] == self.sha256:
            facts.assume_file(self.path, changed_now=False)
            wrong = [(k, want) for k, want in (("mode", self.mode), ("owner", self.owner), ("group", self.group))
                     if want is not None and f[k] != want]
            if not wrong:
                return self._change(self.label, "ok")
            summary = f"attrs {f['mode']} {f['owner']}:{f['group']} → {self.mode} {self.owner}:{self.group}"
            return self._change(self.label, summary, [protocol.Attrs(
                path=f["path"], mode=self.mode, owner=self.owner, group=self.group,
                desc=f"{self.label}: {summary}")], notify=[])
        summary, write, diff = self.write(facts, ctx)
        return self._change(self.label, summary, [write], diff)

    def write(self, facts, ctx) -> tuple[str, protocol.Write, str]:
        """(summary, the write action, diff) replacing what the facts show; the facts then show it."""
        f = facts.file(self.path)
        if f.get("unsafe_write"):
            raise PlanError(f["unsafe_write"])
        room(f, len(self.content), ctx)
        old = base64.b64decode(f["content_b64"]) if "content_b64" in f else None
        if self.secret:
            diff = f"--- {self.label}\n+++ {self.label}\n(secret content: not shown)\n"
        elif self.own:
            diff = own_diff(self.content, self.label, self.own, f["exists"])
        elif f["exists"] and old is None:
            diff = f"{self.label}: content differs ({f['size']} → {len(self.content)} bytes; too large to diff)\n"
        else:
            diff = self.diff(old)
        summary = "create" if not f["exists"] else "update"
        write = protocol.Write(path=f["path"], data=base64.b64encode(self.content).decode(), mode=self.mode,
                               owner=self.owner, group=self.group, validate=self.validate,
                               validator=self.validator, label=self.label,
                               backup=_backup(ctx, f["path"]) if f["exists"] else None,
                               desc=f"{summary} {self.label}")
        facts.assume_file(self.path, exists=True, type="file", sha256=self.sha256, mode=self.mode,
                          owner=self.owner or f.get("owner"), group=self.group or f.get("group"),
                          changed_now=True)
        return summary, write, diff

    def diff(self, old: bytes | None) -> str:
        """What --diff shows of the new content against the host's (None: none there)."""
        return unified_diff(old, self.content, self.label)


def own_diff(content: bytes, label: str, own: str, exists: bool) -> str:
    """specops's own file in one line: "+ <its path> (specops's launcher, 210 lines)"."""
    try:
        size = f"{len(content.decode().splitlines())} lines"
    except UnicodeDecodeError:
        size = f"{len(content)} bytes"
    return (
        f"+ {label} ({own}, {size})\n"
        if not exists
        else f"~ {label} ({own}: not this specops's, replaced by its {size})\n"
    )


def room(f: dict, size: int, ctx) -> None:
    """Refuse, before anything moves, a write the facts already show will fail: its directory on a
    read-only filesystem, or too little room there for what this run stages on that filesystem."""
    where = posixpath.dirname(f["path"])
    if f.get("dir_read_only"):
        raise PlanError(f"{f['path']}: {where} is on a read-only filesystem: nothing can be staged there")
    if f.get("dir_free") is None:
        return
    key = ("staged", f["dir_device"])
    ctx.reserved[key] = ctx.reserved.get(key, 0) + size
    if ctx.reserved[key] > f["dir_free"]:
        raise PlanError(f"{f['path']}: {where} has {f['dir_free'] / 2**20:.1f} MiB free, and this run stages "
                        f"{ctx.reserved[key] / 2**20:.1f} MiB on its filesystem")


def refuse_unsafe(f: dict) -> None:
    """What the probe could not read safely, or found not to be a regular file, is never replaced."""
    if f.get("unsafe"):
        raise PlanError(f["unsafe"])
    if f["exists"] and f.get("type") == "link":
        raise PlanError(f"{f['path']} is a symbolic link; specops replaces only regular files")
    if f["exists"] and f.get("type") != "file":
        raise PlanError(f"{f['path']} exists and is not a regular file")


def render(template: str, **vars: Any) -> str:
    return _render(template, vars)


def render_kept(template: str, **vars: Any) -> str:
    """render() for a template whose output is not secret (a unit file: world-readable on the
    host anyway), kept by the memo under the hash of the templates and the variables: a deploy
    whose unit has not changed never imports Jinja2 (~35 ms)."""
    name = memo.key(
        memo.code_id(__file__, "jinja2"),
        *sorted(f"{p.name}\0{p.read_text()}" for p in TEMPLATES.iterdir() if p.is_file()),
        template,
        json.dumps(vars, sort_keys=True, default=repr),
    )
    return memo.cached("rendered", name, lambda: _render(template, vars).encode()).decode()


def _render(template: str, vars: dict) -> str:
    global _jinja
    import jinja2
    if _jinja is None:
        _jinja = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                                    undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                    trim_blocks=True, lstrip_blocks=True)
    try:
        return _jinja.get_template(template).render(**vars)
    except jinja2.UndefinedError as e:
        raise UsageError(f"specops/templates/{template}: {e.message}") from None
    except jinja2.TemplateError as e:
        raise UsageError(f"specops/templates/{template}: {e}") from None


def template(path: str, name: str, vars: dict, **kw: Any) -> File:
    """A File whose content is a Jinja2 template rendered with StrictUndefined."""
    return File(path, render(name, **vars), **kw)


class Absent(Op):
    def __init__(self, path: str, notify=()):
        self.path, self.notify = path, tuple(notify)

    def wants(self):
        return protocol.Probe(files=[self.path])

    def plan(self, facts, ctx):
        f = facts.file(self.path)
        facts.assume_file(self.path, exists=False)
        if not f["exists"]:
            return self._change(self.path, "ok")
        return self._change(self.path, "remove", [protocol.Remove(path=f["path"], backup=_backup(ctx, f["path"]),
                                                                  desc=f"remove {self.path}")],
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
        return protocol.Probe(files=[self.path], content={self.path: "always"})

    def current(self, facts) -> dict:
        f = facts.file(self.path)
        if not f["exists"]:
            raise PlanError(f"{self.path}: file not found on the host")
        refuse_unsafe(f)
        try:
            doc = json.loads(base64.b64decode(f["content_b64"]))
        except (KeyError, ValueError) as e:
            raise PlanError(f"{self.path}: not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise PlanError(f"{self.path}: the top level is not a JSON object")
        return doc

    def plan(self, facts, ctx):
        doc = self.current(facts)
        if all(dotted_get(doc, k, object()) == v for k, v in self.keys.items()):
            return self._change(self.path, "ok")
        for k, v in self.keys.items():
            dotted_set(doc, k, v)
        new = (json.dumps(doc, indent=2) + "\n").encode()
        # Written by root, so owned by root: never the ownership of a file someone else controls.
        _, write, diff = File(self.path, new, mode=self.mode or "0644").write(facts, ctx)
        facts.assume_file(self.path, content_b64=base64.b64encode(new).decode())
        return self._change(self.path, f"set {', '.join(self.keys)}", [write], diff)
