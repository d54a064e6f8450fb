"""Stop, start and restart systemd units, accounting for every process of their runs.

A process belongs to a unit when it runs as the unit's user and one of these holds:
- it sits in the unit's cgroup;
- its environment carries the INVOCATION_ID of one of the unit's runs (the current one,
  those specops recorded, those systemd logged);
- its stdout or stderr is the unit's journal stream: journald names the unit of each
  stream it serves (/run/systemd/journal/streams), and a child keeps its parent's stream.
The last is what finds SGLang's schedulers after they leave the unit's cgroup: they
retitle themselves with setproctitle, which overwrites /proc/PID/environ (measured: all
NUL bytes), so their INVOCATION_ID can no longer be read.
Nothing else is ever signalled, and a signal goes through a pidfd (or after checking
the process's start time), so a reused PID number cannot be hit.
"""
import os
import pwd
import signal
import time

from specops import protocol
from specops.agent.host import ActionError, clean, read_state, run_quiet, run_streamed, say, update_state, user_name

INVOCATIONS_KEPT = 50


def _show(unit, *props):
    _, out = run_quiet(["systemctl", "show", unit, "-p", ",".join(props)])
    return dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)


def invocations(unit, current=None):
    """Every known run of the unit: current, recorded by specops, and logged by systemd (PID 1)."""
    found = set(read_state().get("invocations", {}).get(unit, []))
    if current:
        found.add(current)
    rc, out = run_quiet(["journalctl", "_PID=1", "UNIT=%s.service" % unit, "-o", "cat",
                         "--output-fields=INVOCATION_ID", "--no-pager"], timeout=20)
    if rc == 0:
        found.update(line.strip() for line in out.splitlines() if len(line.strip()) == 32)
    return found


def remember_invocation(unit):
    """Record the unit's current run, so its processes stay attributable after the journal rotates."""
    current = _show(unit, "InvocationID").get("InvocationID")
    if current:
        def add(state):
            runs = [i for i in state.setdefault("invocations", {}).get(unit, []) if i != current]
            state["invocations"][unit] = (runs + [current])[-INVOCATIONS_KEPT:]
        update_state(add)


class _Unit:
    """What attribution needs to know about one unit, read once."""

    def __init__(self, name):
        props = _show(name, "User", "ControlGroup", "InvocationID", "ActiveState")
        self.name = name
        try:
            self.uid = pwd.getpwnam(props.get("User") or "root").pw_uid
        except KeyError:
            self.uid = None
        self.cgroup = props.get("ControlGroup") or None
        self.active = props.get("ActiveState") in ("active", "activating", "reloading", "deactivating")
        self.current = props.get("InvocationID")
        self._runs = None

    @property
    def runs(self):
        if self._runs is None:  # the journal is read only when a process needs it
            self._runs = invocations(self.name, self.current)
        return self._runs

    def owns(self, pid, uid, cgroups, invocation):
        if self.uid is None or uid != self.uid:
            return False
        if self.cgroup and any((path + "/").find(self.cgroup + "/") >= 0 for path in cgroups):
            return True
        if invocation is not None and (invocation == self.current or invocation in self.runs):
            return True
        return self.name + ".service" in _stream_units(pid)


_PEERS = None  # unix socket inode → its peer's inode, read once per call with `ss`
STREAMS = "/run/systemd/journal/streams"


def _peers():
    global _PEERS
    if _PEERS is None:
        _PEERS = {}
        rc, out = run_quiet(["ss", "-xnH"], timeout=10)
        for line in out.splitlines() if rc == 0 else []:
            f = line.split()
            if len(f) >= 8 and f[-3].isdigit() and f[-1].isdigit():
                _PEERS[f[-3]] = f[-1]
    return _PEERS


def _stream_units(pid):
    """The units whose journal streams the process writes to (its fds 1 and 2)."""
    units = set()
    for fd in (1, 2):
        try:
            target = os.readlink("/proc/%d/fd/%d" % (pid, fd))
            st = os.stat("/proc/%d/fd/%d" % (pid, fd))
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        peer = _peers().get(str(st.st_ino))
        if not peer:
            continue
        try:
            with open("%s/%d:%s" % (STREAMS, st.st_dev, peer)) as f:
                units.update(line[5:].strip() for line in f if line.startswith("UNIT="))
        except OSError:
            pass
    return units


def _proc(pid):
    """(uid, cgroup paths, INVOCATION_ID) of a live process, or None."""
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
        with open("/proc/%d/cgroup" % pid) as f:
            cgroups = [line.rstrip("\n").split(":", 2)[2] for line in f if line.count(":") >= 2]
        invocation = None
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"INVOCATION_ID="):
                    invocation = item[14:].decode(errors="replace")
        return uid, cgroups, invocation
    except OSError:
        return None


def attribute(pids, unit_names):
    """pid → the unit (among unit_names) whose run it belongs to, for the pids that have one."""
    known = [_Unit(n) for n in unit_names]
    out = {}
    for pid in pids:
        info = _proc(pid)
        if info:
            for u in known:
                if u.owns(pid, *info):
                    out[pid] = u.name
                    break
    return out


def title(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    return clean(raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace"))[:120]


def describe(pid, mib=None, unit=None):
    """A protocol.Process as a dict: what a person needs to recognise the process."""
    try:
        user = user_name(os.stat("/proc/%d" % pid).st_uid)
    except OSError:
        user = "?"
    return {"pid": pid, "title": title(pid), "user": user, "mib": mib, "unit": unit}


def _starttime(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        return None


def alive(pid):
    return _starttime(pid) is not None


def _signal(pid, sig, unit):
    """Signal a process only while it is still the one attributed (pidfd pins its identity)."""
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        try:
            info = _proc(pid)  # read after the pidfd pins the process: still ours?
            if not info or not unit.owns(pid, *info):
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
    born = _starttime(pid)
    info = _proc(pid)
    if born is None or not info or not unit.owns(pid, *info) or _starttime(pid) != born:
        return False
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def leftovers(unit):
    """Live processes of any of the unit's runs (scan of /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            info = _proc(int(name))
            if info and unit.owns(int(name), *info) and alive(int(name)):
                out.append(int(name))
    return sorted(out)


def _gpu():
    from specops.agent.probe import gpu_fact
    return gpu_fact()


def _used(gpu):
    return {str(g["index"]): g["memory.used"] for g in gpu.get("gpus", [])} if gpu.get("present") else {}


def stop_unit(ref, others=()):
    """Stop the unit, kill what of its runs survives, and say what is left on the GPUs."""
    t0 = time.time()
    before = _used(_gpu())
    say("  %s: systemctl stop (TimeoutStopSec bounds it)" % ref.name)
    run_quiet(["systemctl", "stop", ref.name])
    unit = _Unit(ref.name)
    report = protocol.StopReport(name=ref.name, seconds=0)
    deadline = time.time() + ref.settle
    left = leftovers(unit)
    while left and time.time() < deadline:  # processes take a moment to release their contexts
        time.sleep(0.3)
        left = leftovers(unit)
    killed = {}
    for sig, wait in ((signal.SIGTERM, ref.grace), (signal.SIGKILL, 5)):
        for p in left:
            d = describe(p, unit=ref.name)
            if _signal(p, sig, unit):
                killed.setdefault(p, d)["signal"] = sig.name
        end = time.time() + wait
        while left and time.time() < end:
            left = [p for p in left if alive(p)]
            time.sleep(0.2)
        if not left:
            break
    report.killed = [protocol.Process(**d) for d in killed.values()]
    gpu = _gpu()
    after = _used(gpu)
    report.freed_mib = {i: before[i] - after[i] for i in before
                        if before[i] is not None and after.get(i) is not None and before[i] != after[i]}
    running = attribute([a["pid"] for a in gpu.get("apps", [])], [ref.name] + list(others))
    for a in gpu.get("apps", []):
        owner = running.get(a["pid"])
        if owner and owner != ref.name:
            continue  # another service of this host, still serving
        a["unit"] = owner
        report.left.append(protocol.Process(**{k: a[k] for k in ("pid", "title", "user", "mib", "unit")}))
    for p in left:
        report.failures.append("pid %d (%s) of %s survived SIGKILL" % (p, title(p), ref.name))
    report.seconds = round(time.time() - t0, 1)
    return report


def start_unit(ref):
    """Start the unit after accounting for leftovers of earlier runs; record its new run."""
    stopped = stop_unit(ref) if _Unit(ref.name).active else None
    unit = _Unit(ref.name)
    stray = leftovers(unit)
    for p in stray:
        say("  %s: killing leftover pid %d (%s) of an earlier run" % (ref.name, p, title(p)))
        _signal(p, signal.SIGKILL, unit)
    run_streamed(["systemctl", "start", ref.name], "start " + ref.name)
    remember_invocation(ref.name)
    return stopped


def restart(ref):
    """Every restart path: stop, account for leftovers, start."""
    report = stop_unit(ref)
    for k in report.killed:
        say("  %s: killed leftover pid %d (%s) with %s" % (ref.name, k.pid, k.title, k.signal))
    for p in report.left:
        if p.unit is None:
            say("  warning: pid %d (%s, user %s) holds %s MiB on a GPU; it belongs to no specops unit, "
                "so it was left alone" % (p.pid, p.title, p.user, p.mib if p.mib is not None else "?"))
    ours = ["pid %d (%s) still holds GPU memory" % (p.pid, p.title) for p in report.left if p.unit == ref.name]
    if report.failures or ours:
        raise ActionError("restart %s: %s" % (ref.name, "; ".join(report.failures + ours)))
    run_streamed(["systemctl", "start", ref.name], "start " + ref.name)
    remember_invocation(ref.name)


def _unowned_failures(report):
    return ["GPU memory still held by pid %d (%s, user %s, %s MiB): %s" % (
        p.pid, p.title, p.user, p.mib if p.mib is not None else "unknown",
        "a process of %s that could not be killed" % p.unit if p.unit else
        "it belongs to no service specops runs here, so it was not killed") for p in report.left]


def stop(req):
    """Answer a protocol.Stop: every unit stopped, and the GPUs proven free (or why not)."""
    names = [r.name for r in req.services] + list(req.others)
    reports = []
    for ref in req.services:
        report = stop_unit(ref, [n for n in names if n != ref.name])
        report.failures += _unowned_failures(report)
        reports.append(report)
    return protocol.StopResult(services=reports, gpus=_used(_gpu()))


def start(req):
    """Answer a protocol.Start; the controller then verifies as the current release says."""
    from specops.agent.releases import current_manifest
    for ref in req.services:
        start_unit(ref)
    manifest = current_manifest()
    return protocol.StartResult(started=[r.name for r in req.services],
                                verify=manifest.get("verify") if manifest else None)
