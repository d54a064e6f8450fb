"""A GPU window's job, ended on the host.  The controller runs the job on a terminal channel
inside a transient scope that root makes (systemd-run --scope --unit WINDOW_PREFIX<16 hex>):
only root can make a system unit of that name, so it is specops's, and whatever the job
starts stays in the scope's cgroup (a process cannot leave it without root), also a child that
ignores Ctrl-C and the terminal's hang-up.  Before the services start again, this stops the
scope: SIGTERM, SIGKILL after WINDOW_STOP_SEC (set when the scope was made), and says which
processes were still running.
"""
import os
import re

from specops import protocol
from specops.agent.host import ActionError, run_quiet
from specops.agent.services.procs import _proc, describe, show
from specops.layout import WINDOW_PREFIX

NAME = re.compile(r"^%s[0-9a-f]{16}$" % re.escape(WINDOW_PREFIX))


def members(cgroup):
    """The pids in `cgroup` or below it (read from each process's own /proc/PID/cgroup)."""
    out = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        info = _proc(pid)
        if info and any(c == cgroup or c.startswith(cgroup + "/") for c in info[1]):
            out.append(pid)
    return out


def end(req):
    """Answer a protocol.EndJob."""
    if not NAME.match(req.scope):
        raise ActionError("not a GPU window's job scope: %r" % req.scope)
    unit = req.scope + ".scope"
    props = show(unit, "ActiveState", "ControlGroup")
    cgroup = props.get("ControlGroup") or ""
    running = [protocol.Process(**describe(pid)) for pid in members(cgroup)] if cgroup else []
    if props.get("ActiveState") in ("active", "activating", "deactivating"):
        rc, out = run_quiet(["systemctl", "stop", unit], timeout=120)
        if rc != 0:
            raise ActionError("could not stop the job's scope %s: %s" % (unit, out.strip()[-300:]))
    left = [protocol.Process(**describe(pid)) for pid in members(cgroup)] if cgroup else []
    return protocol.EndJobResult(ended=running, left=left)
