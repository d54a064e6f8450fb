"""Ops on systemd: unit files (and their diffs, ExecStart argument by argument), a service's
state, and guarded commands."""
from __future__ import annotations

import hashlib
import json
import re
import shlex

from . import handlers
from .. import protocol
from ..layout import UNIT_ONLY, unit_path
from .base import Op
from .files import File
from ..unitwords import EXEC_START, exec_words


class UnitFile(File):
    """A systemd unit file: its diff shows a changed ExecStart as the arguments that changed."""

    def diff(self, old):
        return unit_diff(super().diff(old))


def unit_file(name: str, content: str, notify_restart: bool = True) -> File:
    """A systemd unit, verified by systemd-analyze on the host before it is renamed into place."""
    notify = [handlers.daemon_reload(name)] + ([handlers.restart(name)] if notify_restart else [])
    return UnitFile(unit_path(name), content, mode="0644", validate=["systemd-analyze", "verify", UNIT_ONLY, "{}"],
                    notify=notify)


_OPTION = re.compile(r"^--?[A-Za-z]")  # an option starts a group; "-1" is a value


def unit_diff(diff: str) -> str:
    """A unit's unified diff with each changed ExecStart line (one huge line) made one line of the
    arguments that changed ("~ExecStart: --speculative-num-steps 3 → 5; + --enable-torch-compile"),
    and an unchanged one shown around a change shortened.  A line that does not parse is left whole."""
    lines = diff.splitlines(True)
    removed = [i for i, line in enumerate(lines) if line.startswith("-" + EXEC_START)]
    added = [i for i, line in enumerate(lines) if line.startswith("+" + EXEC_START)]
    if len(removed) == len(added):
        for r, a in zip(removed, added):
            old, new = (exec_words(lines[i][1 + len(EXEC_START):].strip()) for i in (r, a))
            if old is not None and new is not None:
                lines[r], lines[a] = "", f"~ExecStart: {exec_changes(old, new)}\n"
    return "".join(f" {EXEC_START}… (unchanged)\n" if line.startswith(" " + EXEC_START) else line for line in lines)


def _options(words: list[str]) -> tuple[list[str], dict]:
    """(the program and what comes before its first option, {(option, its nth time): its values})."""
    head, options, seen, key = [], {}, {}, None
    for w in words:
        if _OPTION.match(w):
            seen[w] = seen.get(w, -1) + 1
            key = (w, seen[w])
            options[key] = []
        elif key is None:
            head.append(w)
        else:
            options[key].append(w)
    return head, options


def exec_changes(old: list[str], new: list[str]) -> str:
    """What changed from one command line to the other, option by option: "--speculative-num-steps
    3 → 5; + --enable-torch-compile; - --disable-radix-cache"; a new program (or a word of it) as
    "old → new"."""
    (old_head, was), (new_head, now) = _options(old), _options(new)
    show = lambda words: " ".join(shlex.quote(w) for w in words)  # noqa: E731
    if len(old_head) == len(new_head):  # the program's words, each that changed (a stack's python)
        out = [f"{show([a])} → {show([b])}" for a, b in zip(old_head, new_head) if a != b]
    else:
        out = [f"{show(old_head)} → {show(new_head)}"]
    for key, values in now.items():
        if key not in was:
            out.append(f"+ {show([key[0], *values])}")
        elif was[key] != values:
            out.append(f"{key[0]} {show(was[key]) or '(no value)'} → {show(values) or '(no value)'}")
    out += [f"- {show([key[0], *values])}" for key, values in was.items() if key not in now]
    if out:
        return "; ".join(out)
    return "the same arguments, in another order" if old != new else "the same arguments, quoted otherwise"


class Service(Op):
    """A systemd service: started, and enabled (`enabled` None: left as it is)."""

    def __init__(self, name: str, enabled: bool | None = True, unit: protocol.UnitRef | None = None):
        self.name, self.enabled = name, enabled
        self.unit = unit or protocol.UnitRef(name=name)  # how a start accounts for leftovers
        self.services = (name,)

    def wants(self):
        return protocol.Probe(units=[self.name])

    def plan(self, facts, ctx):
        u = facts.unit(self.name)
        actions, said = enabling(self.name, u, self.enabled), []
        said += [("enable" if self.enabled else "disable")] if actions else []
        restarting = handlers.restart(self.name) in ctx.notified
        if u.get("ActiveState") not in ("active", "activating", "reloading") and not restarting:
            actions.append(protocol.StartUnit(unit=self.unit, desc=f"start {self.name}"))
            said.append("start")
        return self._change(f"service {self.name}", ", ".join(said) or "ok", actions)


def enabling(name: str, fact: dict, enabled: bool | None, now: bool = False) -> list:
    """The Enable action that makes unit `name` (its probe `fact`) enabled or disabled as asked;
    none when it already is.  Without `now` it only links (a changed unit gets the daemon-reload
    handler)."""
    want = None if enabled is None else "enabled" if enabled else "disabled"
    if want is None or fact.get("UnitFileState") == want:
        return []
    verb = "enable" if enabled else "disable"
    return [protocol.Enable(unit=name, enable=enabled, now=now, was=fact.get("UnitFileState") or None,
                            desc=f"{verb}{' and start' if now and enabled else ''} {name}")]


class Timer(Op):
    """A systemd timer, enabled and started."""

    def __init__(self, name: str):
        self.name = name

    def wants(self):
        return protocol.Probe(units=[self.name])

    def plan(self, facts, ctx):
        u = facts.unit(self.name)
        actions = enabling(self.name, u, True, now=True)
        if not actions and u.get("ActiveState") != "active":
            actions = [protocol.Enable(unit=self.name, now=True, was="enabled", desc=f"start {self.name}")]
        return self._change(f"timer {self.name}", actions[0].desc if actions else "ok", actions)


class Command(Op):
    """A guarded command: skipped when `creates` exists or the `unless` check succeeds."""

    def __init__(self, cmd: str | list, desc: str, unless: str | None = None,
                 creates: str | None = None, notify=()):
        self.cmd, self.desc, self.unless, self.creates = cmd, desc, unless, creates
        self.notify = tuple(notify)
        self.check_id = "cmd:" + hashlib.sha256(json.dumps([cmd, unless]).encode()).hexdigest()[:12]

    def wants(self):
        return protocol.Probe(checks={self.check_id: self.unless} if self.unless else {},
                              files=[self.creates] if self.creates else [])

    def plan(self, facts, ctx):
        if self.creates and facts.file(self.creates)["exists"]:
            return self._change(self.desc, "ok")
        if self.unless and facts.check(self.check_id) == 0:
            return self._change(self.desc, "ok")
        if self.creates:
            facts.assume_file(self.creates, path=self.creates, exists=True)
        return self._change(self.desc, "run", [protocol.Run(cmd=self.cmd, desc=self.desc)])
