"""Ops on systemd: unit files, a service's state, and guarded commands."""
from __future__ import annotations

import hashlib
import json

from . import handlers
from .. import protocol
from ..layout import UNIT_ONLY, unit_path
from .base import Op
from .files import File


def unit_file(name: str, content: str, notify_restart: bool = True) -> File:
    """A systemd unit, verified by systemd-analyze on the host before it is renamed into place."""
    notify = [handlers.daemon_reload(name)] + ([handlers.restart(name)] if notify_restart else [])
    return File(unit_path(name), content, mode="0644", validate=["systemd-analyze", "verify", UNIT_ONLY, "{}"],
                notify=notify)


class Service(Op):
    """A systemd service's state: started or stopped, enabled or not."""

    def __init__(self, name: str, state: str = "started", enabled: bool | None = True,
                 unit: protocol.UnitRef | None = None):
        self.name, self.state, self.enabled = name, state, enabled
        self.unit = unit or protocol.UnitRef(name=name)  # how a start accounts for leftovers
        self.services = (name,)

    def wants(self):
        return protocol.Probe(units=[self.name])

    def plan(self, facts, ctx):
        u = facts.unit(self.name)
        actions, said = [], []
        restarting = handlers.restart(self.name) in ctx.notified
        active = u.get("ActiveState") in ("active", "activating", "reloading")
        if self.enabled is not None and u.get("UnitFileState") != ("enabled" if self.enabled else "disabled"):
            verb = "enable" if self.enabled else "disable"
            # --no-reload: enabling is a symlink; a changed unit gets the daemon-reload handler.
            actions.append(protocol.Run(cmd=["systemctl", verb, "--quiet", "--no-reload", self.name],
                                        desc=f"{verb} {self.name}"))
            said.append(verb)
        if self.state == "started" and not active and not restarting:
            actions.append(protocol.StartUnit(unit=self.unit, desc=f"start {self.name}"))
            said.append("start")
        elif self.state == "stopped" and active:
            actions.append(protocol.Run(cmd=["systemctl", "stop", self.name], desc=f"stop {self.name}"))
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
