"""Ops on running code: no stale bytecode, and no service running older code than its files."""
from __future__ import annotations

import base64
import dataclasses
import json

from . import handlers
from .. import protocol
from ..layout import STATE_FILE, restart_stamp_is_stale
from .base import Op

STATE_WANTS = protocol.Probe(files=[STATE_FILE], content={STATE_FILE: "always"})


def host_state(facts) -> dict:
    """specops's own record on the host (bytecode purges), from the probe."""
    f = facts.file(STATE_FILE)
    if not f.get("exists") or "content_b64" not in f:
        return {}
    try:
        return json.loads(base64.b64decode(f["content_b64"]))
    except ValueError:
        return {}


class PurgeBytecode(Op):
    """No cached bytecode may outlive a managed module source.

    Python trusts a .pyc whose recorded source size and mtime match (so a same-size
    edit that keeps the mtime runs the old code), and never checks an unchecked-hash
    .pyc at all.  So every <module>.*.pyc is removed whenever the source is replaced,
    when specops has no purge on record for the current content, or when a .pyc is
    older than the last purge.  The purge then installs the bytecode its validator compiled
    from the new source, as a checked-hash .pyc (specops.agent.converge.bytecode).  That, and bytecode
    the restarted service writes, is not older than the purge, so a second run does nothing.
    """

    def __init__(self, source: str, label: str | None = None, notify=()):
        self.source, self.label, self.notify = source, label or source, tuple(notify)

    def wants(self):
        return protocol.Probe(files=[self.source, STATE_FILE], content=dict(STATE_WANTS.content))

    def plan(self, facts, ctx):
        f = facts.file(self.source)
        target = f"bytecode of {self.label}"
        if f.get("unresolved") or not f.get("exists"):
            return self._change(target, "ok")
        record = host_state(facts).get("purges", {}).get(f["path"])
        pycs = f.get("pycache", [])
        if f.get("changed_now"):
            reason = "source replaced"
        elif not record or record["sha256"] != f["sha256"]:
            reason = "no purge on record for this content"
        elif any(p["mtime"] < record["purged_at"] for p in pycs):
            reason = "bytecode older than the last purge"
        else:
            return self._change(target, "ok")
        names = ", ".join(p["name"] for p in pycs) or "none cached yet"
        return self._change(target, f"purge ({reason}): {names}", [protocol.Purge(
            path=f["path"], sha256=f["sha256"], desc=f"purge bytecode of {self.label}")])


WEIGHTS_EVENT = "weights:"


class RunningCode(Op):
    """A running service must have started after every file it runs from last changed; if not,
    the change is its restart."""

    def __init__(self, service: str, sources: list[str], weights: list[str] = ()):
        self.service, self.sources, self.weights = service, sources, list(weights)
        self.notify = (handlers.restart(service),)

    def wants(self):
        return protocol.Probe(units=[self.service], files=[*self.sources, STATE_FILE],
                              content=dict(STATE_WANTS.content), weights=self.weights)

    def plan(self, facts, ctx):
        target = f"running code of {self.service}"
        u = facts.unit(self.service)
        started = u.get("ExecMainStartTimestamp")
        if u.get("ActiveState") != "active" or not started or handlers.restart(self.service) in ctx.notified:
            return self._change(target, "ok")
        purges = host_state(facts).get("purges", {})
        events = []
        for key in self.sources:
            f = facts.file(key)
            if f.get("exists") and f.get("mtime"):
                events.append((f["mtime"], f["path"]))
            if f.get("path") in purges:
                events.append((purges[f["path"]]["purged_at"], f"the bytecode purge of {f['path']}"))
        for dest in self.weights:  # the manifest says when the weights' content last changed
            changed_at = ((facts.data.get("weights", {}).get(dest) or {}).get("manifest") or {}).get("changed_at")
            if changed_at:
                events.append((changed_at, WEIGHTS_EVENT + dest))
        if not restart_stamp_is_stale(started, events):
            return self._change(target, "ok")
        what = max(events)[1]
        why = (f"weights changed since the server started ({what[len(WEIGHTS_EVENT):]})"
               if what.startswith(WEIGHTS_EVENT) else f"running old code: started before {what} changed")
        change = self._change(target, f"{why}; restart", notify=list(self.notify))
        return dataclasses.replace(change, stale=True)
