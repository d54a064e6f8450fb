"""Stop, start and restart systemd units, accounting for every process of their runs.

Every restart path (deploy's handler, undo, rollback, start after a GPU window) goes
through `restart` or `start_unit`: stop, kill what of the unit's runs survives (see
procs for how a process is attributed), then start.
"""
import time

from specops import protocol
from specops.agent.services import gpus
from specops.agent.host import ActionError, run_quiet, run_streamed, say
from specops.agent.lean import signal
from specops.agent.services.procs import (
    Unit,
    alive,
    attribute,
    catches,
    describe,
    leftovers,
    remember_invocation,
    send,
    show,
    title,
)

def _gpu():
    from specops.agent.services.gpus import gpu_fact
    return gpu_fact()


def _used(gpu):
    return {str(g["index"]): g["memory.used"] for g in gpu.get("gpus", [])} if gpu.get("present") else {}


def daemon_reload(names=()):
    """systemctl daemon-reload, unless systemd already has each unit of `names` as written: it
    loads a unit file it found missing when asked for it again (systemd 246 and later), and
    NeedDaemonReload says whether a loaded unit's file changed since.  A reload reruns every
    generator and rereads every unit: the costliest thing a first deploy asks of PID 1."""
    if names:
        _, out = run_quiet(["systemctl", "show", "-p", "LoadState,NeedDaemonReload", "--", *names])
        loaded = [line for line in out.splitlines() if line in ("LoadState=loaded", "NeedDaemonReload=no")]
        if len(loaded) == 2 * len(names):
            say("  daemon-reload: not needed, systemd has %s as written" % ", ".join(names))
            return
    run_streamed(["systemctl", "daemon-reload"], "daemon-reload")


# How a run ends that stopped by itself: a rank whose peer was stopped first exits at once (its
# NCCL communicator is gone), often before its own SIGTERM is handled.  Not "timeout": a server
# that outlived TimeoutStopSec and was killed hung, and stays "failed" for status to show.
ENDED_BY_ITSELF = ("exit-code", "signal", "core-dump")


def _clear_failure(name):
    """A rank of a multi-node service failed while being stopped: a failure the stop itself
    caused (a peer went first), unless it hung.  A single-node unit's failure is left as it is."""
    result = show(name, "Result").get("Result")
    if result not in ENDED_BY_ITSELF:
        say("  %s: failed while being stopped (%s); left \"failed\"" % (name, result))
    else:
        rc, out = run_quiet(["systemctl", "reset-failed", name])
        say("  %s: its run ended with %s while being stopped (as a rank does whose peer went first); %s"
            % (name, result, "failed state cleared" if rc == 0 else "reset-failed: " + out.strip()))


def _skip_drain(ref, unit):
    """A stop that need not drain (ref.quick): the signal makes the launcher set the server's own
    force-shutdown variable in the running process, which the server reads after SIGTERM.  Sent
    only to a main process that catches it (one from an older launcher would die of it)."""
    sig = getattr(signal, ref.quick)
    if unit.main and catches(unit.main, sig) and send(unit.main, sig, unit):
        say("  %s: need not drain: told to exit at SIGTERM without waiting for its requests" % ref.name)
    else:
        say("  %s: its server cannot be told to skip the drain (started by an older launcher?)" % ref.name)


def _timed_out(name, waited):
    """A stop that ended in systemd's kill at TimeoutStopSec, said with the seconds it waited."""
    if show(name, "Result").get("Result") != "timeout":
        return None
    say("  %s: still running after TimeoutStopSec: systemd killed it (result 'timeout') after %.1f s; "
        "a server that drains keeps serving until no request is left" % (name, waited))
    return round(waited, 1)


def enable(a):
    """A protocol.Enable: link (or unlink) the unit; with `now`, start (stop) it too, which
    reloads systemd first (a new unit file)."""
    verb = "enable" if a.enable else "disable"
    # --no-reload only for a unit PID 1 has no file state of (`was` None: new): of one it has,
    # it keeps the state as of its last reload, and would say `disabled` to every later probe,
    # which would enable the unit again on every deploy.
    reload = ["--now"] if a.now else ["--no-reload"] if a.was is None else []
    run_streamed(["systemctl", verb, "--quiet"] + reload + ["--", a.unit], a.desc or verb)


def unenable(a):
    """Put back what an Enable changed: the unit file state it had (`was`), stopping a unit its
    `now` started.  A state other than enabled or disabled (static, masked) is left alone."""
    if (a.was == "enabled") == a.enable or a.was not in ("enabled", "disabled", None):
        return
    back = not a.enable
    run_quiet(["systemctl", "enable" if back else "disable", "--quiet"] + (["--now"] if a.now and not back else [])
              + ["--", a.unit])


def stop_unit(ref, others=(), measure=True):
    """Stop the unit, kill what of its runs survives, and say what is left on the GPUs (asking
    nvidia-smi, which is slow on real boxes, only when `measure` or something was running)."""
    t0 = time.time()
    before = _used(_gpu()) if measure else {}
    unit = Unit(ref.name)  # read just before the stop: a failure after it is one the stop caused
    was_active = unit.active
    report = protocol.StopReport(name=ref.name, seconds=0)
    if unit.state != "inactive" or unit.queued:  # nothing to stop, nothing about to start: leftovers below
        if ref.quick and was_active:
            _skip_drain(ref, unit)
        say("  %s: systemctl stop (TimeoutStopSec bounds it)" % ref.name)
        asked = time.time()
        run_quiet(["systemctl", "stop", ref.name])
        failed_before, unit = unit.state == "failed", Unit(ref.name)
        if failed_before and unit.state == "failed":
            report.failed_before = show(ref.name, "Result").get("Result") or "?"
        if unit.state == "failed" and not failed_before:
            report.timed_out = _timed_out(ref.name, time.time() - asked)
            if ref.ranks > 1:
                _clear_failure(ref.name)
            if Unit(ref.name).state == "failed":  # a single node's failure is its own: kept for status
                report.left_failed = show(ref.name, "Result").get("Result") or "?"
    deadline = time.time() + ref.settle
    left = leftovers(unit)
    while left and time.time() < deadline:  # processes take a moment to release their contexts
        time.sleep(0.3)
        left = leftovers(unit)
    killed = {}
    for name, wait in (("SIGTERM", ref.grace), ("SIGKILL", 5)):
        for p in left:
            d = describe(p, unit=ref.name)
            if send(p, getattr(signal, name), unit):
                killed.setdefault(p, d)["signal"] = name
        end = time.time() + wait
        while left and time.time() < end:
            left = [p for p in left if alive(p)]
            time.sleep(0.2)
        if not left:
            break
    report.killed = [protocol.Process(**d) for d in killed.values()]
    gpu = _gpu() if measure or was_active or killed else {}
    after = _used(gpu)
    report.freed_mib = {i: before[i] - after[i] for i in before
                        if before[i] is not None and after.get(i) is not None and before[i] != after[i]}
    running = attribute([a["pid"] for a in gpu.get("apps", [])], [ref.name] + list(others))
    for a in gpu.get("apps", []):
        if running.get(a["pid"]) or (ref.gpus is not None and a.get("gpu") not in ref.gpus):
            continue  # ours (a survivor: below), another service's, or on a GPU this unit does not use
        report.left.append(protocol.Process(**{k: a[k] for k in ("pid", "title", "user", "mib")}))
    for p in left:
        report.failures.append("pid %d (%s) of %s survived SIGKILL" % (p, title(p), ref.name))
    report.seconds = round(time.time() - t0, 1)
    return report


def _start(name):
    """Start the unit as written, and record its run.  A unit whose file changed since systemd
    loaded it (a run cut between the file's rename and its daemon-reload, or a hand edit) would
    start as loaded, and nothing after would reload it: the file on disk is already as the
    inventory wants.  So it is reloaded first."""
    if show(name, "NeedDaemonReload").get("NeedDaemonReload") == "yes":
        say("  daemon-reload: %s's unit file changed since systemd loaded it" % name)
        run_streamed(["systemctl", "daemon-reload"], "daemon-reload")
    run_streamed(["systemctl", "start", name], "start " + name)
    gpus.started(name, remember_invocation(name))


def start_unit(ref, others=()):
    """Start the unit, after accounting for what of its earlier runs is still alive; record its run."""
    report = stop_unit(ref, others, measure=False)
    for k in report.killed:
        say("  %s: killed leftover pid %d (%s) of an earlier run with %s" % (ref.name, k.pid, k.title, k.signal))
    if report.failures:
        raise ActionError("start %s: %s" % (ref.name, "; ".join(report.failures)))
    _start(ref.name)


def restart(ref, others=()):
    """Every restart path: stop, account for leftovers, start.  `others`: the host's other units."""
    report = stop_unit(ref, others, measure=False)
    for k in report.killed:
        say("  %s: killed leftover pid %d (%s) with %s" % (ref.name, k.pid, k.title, k.signal))
    for p in report.left:
        say("  warning: pid %d (%s, user %s) holds %s MiB on a GPU; it belongs to no service specops "
            "runs here, so it was left alone" % (p.pid, p.title, p.user, p.mib if p.mib is not None else "?"))
    if report.failures:
        raise ActionError("restart %s: %s" % (ref.name, "; ".join(report.failures)))
    _start(ref.name)


def _unowned_failures(report):
    return ["GPU memory still held by pid %d (%s, user %s, %s MiB): it belongs to no service specops "
            "runs here, so it was not killed" % (p.pid, p.title, p.user, p.mib if p.mib is not None else "unknown")
            for p in report.left]


def stop(req):
    """Answer a protocol.Stop: every unit stopped, and the GPUs proven free (or why not)."""
    names = [r.name for r in req.services] + list(req.others)
    reports = []
    for ref in req.services:
        report = stop_unit(ref, [n for n in names if n != ref.name])
        report.failures += _unowned_failures(report)
        if req.disable:  # with its reload: PID 1's UnitFileState, which deploy reads, must say disabled
            rc, out = run_quiet(["systemctl", "disable", "--quiet", ref.name])
            if rc != 0:
                report.failures.append("systemctl disable %s: %s" % (ref.name, out.strip()[-300:]))
        # is-enabled reads the links on disk; PID 1's UnitFileState still says "enabled" until a reload
        rc, out = run_quiet(["systemctl", "is-enabled", ref.name])
        report.enabled = out.strip().splitlines()[-1] if out.strip() else None
        reports.append(report)
    return protocol.StopResult(services=reports, gpus=_used(_gpu()))
