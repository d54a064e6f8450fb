"""Handlers: what an op asks to happen once, after every role has run.

An op notifies a Handler; the run collects them, and `actions` turns them into the
batch's last actions: each handler once, daemon-reload before any restart.  A restart
is the agent's accounted restart (stop, leftovers, start), never a bare systemctl restart.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import protocol


@dataclass(frozen=True, order=True)
class Handler:
    verb: str                  # "daemon-reload" or "restart"
    service: str | None = None

    def __str__(self) -> str:
        return self.verb if self.service is None else f"{self.verb} {self.service}"


DAEMON_RELOAD = Handler("daemon-reload")  # whatever systemd has loaded
ORDER = {"daemon-reload": 0, "restart": 1}


def restart(service: str) -> Handler:
    return Handler("restart", service)


def daemon_reload(unit: str) -> Handler:
    """A daemon-reload for a changed unit file: skipped when systemd already has it as written."""
    return Handler("daemon-reload", unit)


def restarts(handlers) -> list[str]:
    """The services these handlers restart."""
    return [h.service for h in handlers if h.verb == "restart"]


def ordered(notified: list[Handler]) -> list[Handler]:
    """Each handler once, daemon-reload first, otherwise in the order they were notified."""
    return sorted(dict.fromkeys(notified), key=lambda h: ORDER[h.verb])


def actions(notified: list[Handler], units: dict[str, protocol.UnitRef] | None = None) -> list:
    """The handlers as the batch's last actions; `units` describes the services to restart."""
    out, notified = [], ordered(notified)
    reloads = [h.service for h in notified if h.verb == "daemon-reload"]
    if reloads:  # one reload for every unit; whatever systemd has loaded if one is not named
        named = [] if None in reloads else reloads
        out.append(protocol.DaemonReload(units=named, desc="handler: daemon-reload" +
                                         (f" ({', '.join(named)})" if named else "")))
    for h in notified:
        if h.verb == "restart":
            ref = (units or {}).get(h.service) or protocol.UnitRef(name=h.service)
            others = sorted(n for n in (units or {}) if n != h.service)
            out.append(protocol.Restart(unit=ref, others=others, desc=f"handler: {h}"))
    return out
