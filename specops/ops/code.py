"""Ops on running code: no stale bytecode, and no service running older code than its files."""
from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

from . import handlers
from .. import memo, protocol
from ..layout import CHECKED_HASH, STATE_FILE, restart_stamp_is_stale
from .base import Op, PlanError

STATE_WANTS = protocol.Probe(files=[STATE_FILE], content={STATE_FILE: "always"})


def host_state(facts) -> dict:
    """specops's own record on the host (bytecode purges), from the probe: parsed once for these
    facts (each patched file's PurgeBytecode and RunningCode read it: three parses a no-op), and
    again only when the file's fact changes.  The dict is shared: its readers do not change it."""
    f = facts.file(STATE_FILE)
    if not f.get("exists") or "content_b64" not in f:
        return {}
    raw = f["content_b64"]
    kept = facts.parsed.get(STATE_FILE)
    if kept is None or kept[0] != raw:
        try:
            state = json.loads(base64.b64decode(raw))
        except ValueError:
            state = {}
        kept = facts.parsed[STATE_FILE] = (raw, state)
    return kept[1]


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
    the change is its restart.  Its weights too: after their content last changed (the
    manifest's changed_at) and after any of their files was last written (its ctime, which an
    edit cannot put back); and weights that differ from their manifest (a deploy puts the
    manifest's back first) are not what it should run either."""

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
        events, managed = [], set()
        for key in self.sources:
            f = facts.file(key)
            managed.add(f.get("path") or key)
            if f.get("exists") and f.get("mtime"):
                events.append((f["mtime"], f["path"]))
            if f.get("path") in purges:
                events.append((purges[f["path"]]["purged_at"], f"the bytecode purge of {f['path']}"))
        differ = []
        for dest in self.weights:
            have = facts.data.get("weights", {}).get(dest) or {}
            for at in ((have.get("manifest") or {}).get("changed_at"), (have.get("newest") or [None])[0]):
                if at:
                    events.append((at, WEIGHTS_EVENT + dest))
            # a file the service manages (the draft's config.json with draft_config) is checked as its code is
            mine = [n for n in have.get("differ") or () if f"{dest}/{n}" not in managed]
            differ += [(dest, len(mine))] if mine else []
        if restart_stamp_is_stale(started, events):
            what = max(events)[1]
            why = (f"weights changed since the server started ({what[len(WEIGHTS_EVENT):]})"
                   if what.startswith(WEIGHTS_EVENT) else f"running old code: started before {what} changed")
        elif differ:
            why = f"running weights that differ from their manifest ({differ[0][0]}: {differ[0][1]} file(s) changed " \
                  f"on the host)"
        else:
            return self._change(target, "ok")
        change = self._change(target, f"{why}; restart", notify=list(self.notify))
        return dataclasses.replace(change, stale=True)


def precompiled(source: bytes, venv: dict, module: str, label: str) -> list[str] | None:
    """[.pyc name, base64 .pyc] of `source` for the venv's interpreter (its probe fact), compiled
    here when this interpreter writes the same bytecode (the same importlib MAGIC_NUMBER), else
    None: the host's interpreter compiles it while validating.  A checked-hash .pyc (PEP 552),
    as the validator makes; kept by the memo, so a fleet's first deploy compiles a patched module
    once instead of once per host.  A file that does not compile is refused here, as the host's
    validator would."""
    from importlib.util import MAGIC_NUMBER
    if venv.get("magic") != MAGIC_NUMBER.hex() or not venv.get("tag"):
        return None
    pyc = memo.cached(
        "pyc", memo.key(_RECIPE, MAGIC_NUMBER.hex(), source), lambda: _compiled(source, label, venv["tag"])
    )
    return [f"{module}.{venv['tag']}.pyc", base64.b64encode(pyc).decode()]


_RECIPE = Path(__file__).read_bytes()  # this module: how the bytecode is made


def _compiled(source: bytes, label: str, tag: str) -> bytes:
    import marshal
    import warnings
    from importlib.util import MAGIC_NUMBER, source_hash
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings of upstream code are SGLang's
            code = compile(source, label, "exec", dont_inherit=True, optimize=0)  # as the host's -I validator
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise PlanError(
            f"compiling for {tag} refused {label}: {type(e).__name__}: {getattr(e, 'msg', e)}{where}"
        ) from None
    return MAGIC_NUMBER + CHECKED_HASH + source_hash(source) + marshal.dumps(code)
