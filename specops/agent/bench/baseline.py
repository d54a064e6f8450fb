"""spec-bench's baseline: the same target with the same arguments minus the speculative ones, run
as a transient unit (systemd-run), never as a change to the managed unit, and only inside a GPU
window (the managed service stopped, its GPUs proven free).

The transient unit is named specops-baseline-<service>: only root can make system units, so a
unit of that name is ours (one a killed run left is stopped and collected first).  If the
agent's session ends while the baseline runs, the baseline is stopped and the service started
again (the controller, when it is still there, also verifies it).  It reads the
service's own env file (the API key goes to the server through the launcher, as for the managed
unit) and, like it, runs as root.  Stopping it goes through units.stop_unit, so its leftovers are
accounted for and its GPU memory proven free like any service's.
"""
import subprocess
import time

from specops import protocol
from specops.agent.services import http, listeners
from specops.agent.host import ActionError, journal, on_interrupt, run_quiet, say
from specops.agent.services.procs import Unit, remember_invocation, show
from specops.agent.services.asking import redacted
from specops.agent.services.units import stop_unit
from specops.layout import BASELINE_PREFIX, env_file


STARTUP_LINES = 20000  # of a run's journal read for its ready line, at most


def unit_name(service):
    return BASELINE_PREFIX + service


def _restore(name, service):
    run_quiet(["systemctl", "stop", name])
    if not Unit(service).active:
        run_quiet(["systemctl", "start", "--no-block", service])


def start(req):
    """Answer a protocol.BaselineStart: the transient unit started and answering `ready`."""
    name = unit_name(req.service)
    if Unit(name).active:  # a killed run's
        stop_unit(protocol.UnitRef(name=name, gpus=req.gpus), measure=False)
    run_quiet(["systemctl", "reset-failed", name])
    argv = ["systemd-run", "--unit=" + name, "--collect", "--quiet", "--property=Type=simple",
            "--property=KillMode=control-group", "--property=EnvironmentFile=" + env_file(req.service)]
    argv += ["--property=%s=%s" % kv for kv in sorted(req.properties.items())]
    argv += ["--setenv=%s=%s" % (k, v) for k, v in sorted(req.env.items())]
    # systemd expands $VAR in a transient unit's command as in ExecStart=; $$ is a plain $.
    rc, out = run_quiet(argv + ["--"] + [a.replace("$", "$$") for a in req.argv])
    if rc != 0:
        raise ActionError("the baseline server did not start: %s" % redacted(req.service, out.strip()[-300:]))
    # If this agent's session ends before the controller restored the service (Ctrl-C, a lost
    # link, a killed controller), the baseline goes and the service comes back without it.
    on_interrupt(lambda: _restore(name, req.service))
    remember_invocation(name)
    # What runs first (a candidate's settings), then the unit: spec-bench's baseline and each of
    # spec-tune's candidates run in turn under the one transient unit name the window cleans up.
    say("  %s: %s started (transient unit %s)" % (req.label, req.what, name))
    deadline = time.time() + req.timeout
    while time.time() < deadline:
        try:
            if http.request(req.host, req.port, "GET", req.ready, timeout=5).status == 200:
                problem = listeners.Listener(name, req.port).problem()
                if problem:  # what answers is not the baseline: it gets no key and no load
                    raise ActionError("port %d: %s; spec-bench sends it nothing" % (req.port, problem))
                say("  %s: ready" % req.label)
                return protocol.BaselineResult(unit=name)
        except OSError:
            pass
        if not Unit(name).active:
            raise ActionError("the %s server exited before it was ready: %s"
                              % (req.label, redacted(req.service, journal(name, 10))))
        time.sleep(0.5)
    raise ActionError("the %s server was not ready within %.0f s: %s"
                      % (req.label, req.timeout, redacted(req.service, journal(name, 10))))


def startup(req):
    """Answer a protocol.Startup: the current run's start to its ready line, from its own journal
    lines (_SYSTEMD_INVOCATION_ID is set by journald, so no other process can forge one)."""
    import json
    import re
    props = show(req.unit, "InvocationID", "ExecMainStartTimestampMonotonic")
    run, began = props.get("InvocationID"), props.get("ExecMainStartTimestampMonotonic", "0")
    if not run or not began.isdigit() or began == "0":
        return protocol.StartupResult()
    ready = re.compile(req.ready_line)
    # oldest first, read as it comes and left as soon as the line is found: the ready line is near
    # the start of a run, and a long run's journal can be large
    proc = subprocess.Popen(["journalctl", "_SYSTEMD_INVOCATION_ID=" + run, "--no-pager", "-o", "json",
                             "--output-fields=MESSAGE"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            universal_newlines=True)
    try:
        for n, row in enumerate(proc.stdout):
            if n >= STARTUP_LINES:
                break
            try:
                entry = json.loads(row)
            except ValueError:
                continue
            if isinstance(entry.get("MESSAGE"), str) and ready.search(entry["MESSAGE"]):
                at = entry.get("__MONOTONIC_TIMESTAMP", "")
                if at.isdigit() and int(at) >= int(began):
                    return protocol.StartupResult(seconds=round((int(at) - int(began)) / 1e6, 2))
        return protocol.StartupResult()
    finally:
        proc.kill()
        proc.wait()
