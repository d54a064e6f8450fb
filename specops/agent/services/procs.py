"""Which unit a process belongs to, and signalling only those.

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
import struct

from specops.agent.host import clean, read_state, run_quiet, update_state, user_name
from specops.agent.lean import signal, socket

INVOCATIONS_KEPT = 50


def show(unit, *props):
    """systemctl show, as a dict of the asked properties."""
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
    """Record the unit's current run, so its processes stay attributable after the journal
    rotates; returns its InvocationID."""
    current = show(unit, "InvocationID").get("InvocationID")
    if current:
        def add(state):
            runs = [i for i in state.setdefault("invocations", {}).get(unit, []) if i != current]
            state["invocations"][unit] = (runs + [current])[-INVOCATIONS_KEPT:]
        update_state(add)
    return current


class Unit:
    """What attribution needs to know about one unit, read once."""

    def __init__(self, name, props=None):
        """`props`: systemctl show's properties if the caller has them already (probe.unit_fact)."""
        props = props or show(name, "User", "ControlGroup", "InvocationID", "ActiveState", "MainPID", "Job")
        self.name = name
        try:
            self.uid = pwd.getpwnam(props.get("User") or "root").pw_uid
        except KeyError:
            self.uid = None
        self.cgroup = props.get("ControlGroup") or None
        self.state = props.get("ActiveState")
        self.active = self.state in ("active", "activating", "reloading", "deactivating")
        self.queued = props.get("Job", "0") not in ("", "0")  # a start or stop job waiting to run
        self.current = props.get("InvocationID")
        self.main = int(props["MainPID"]) if props.get("MainPID", "").isdigit() else 0
        self._runs = self._current_streams = None

    @property
    def runs(self):
        if self._runs is None:  # the journal is read only when a process needs it
            self._runs = invocations(self.name, self.current)
        return self._runs

    def owns(self, pid, uid, cgroups, invocation):
        return self.run_of(pid, uid, cgroups, invocation) is not None

    def run_of(self, pid, uid, cgroups, invocation):
        """"current" or "earlier" when the process belongs to one of the unit's runs, else None."""
        if self.uid is None or uid != self.uid:
            return None
        if invocation is not None:
            if invocation == self.current:
                return "current"
            if invocation in self.runs:
                return "earlier"
        in_cgroup = self.cgroup and any(p == self.cgroup or p.startswith(self.cgroup + "/") for p in cgroups)
        streams = _streams(pid)
        if self.name + ".service" in streams.values():
            if self._current_streams is None:
                self._current_streams = set(_streams(self.main)) if self.main else set()
            return "current" if set(streams) & self._current_streams else "earlier"
        return "current" if in_cgroup else None


STREAMS = "/run/systemd/journal/streams"


def peer_inode(inode):
    """The inode of the other end of a connected unix socket, asked of the kernel (sock_diag
    netlink, UNIX_DIAG_PEER): no text to parse, so no socket name can forge an answer."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)  # NETLINK_SOCK_DIAG
    except OSError:
        return None
    try:
        req = struct.pack("=BBHIII2I", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, inode, 0x4, 0xFFFFFFFF, 0xFFFFFFFF)
        sock.send(struct.pack("=IHHII", 16 + len(req), 20, 1, 1, 0) + req)  # SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST
        data = sock.recv(65536)
    except OSError:
        return None
    finally:
        sock.close()
    length, kind = struct.unpack_from("=IH", data)
    if kind != 20 or length < 32:
        return None
    at = 16 + 16  # the header, then struct unix_diag_msg
    while at + 4 <= length:
        size, attr = struct.unpack_from("=HH", data, at)
        if attr == 2 and size >= 8:  # UNIX_DIAG_PEER
            return struct.unpack_from("=I", data, at + 4)[0]
        if size < 4:
            break
        at += (size + 3) & ~3
    return None


def _streams(pid):
    """{journal stream inode: unit} for the streams the process writes to (its fds 1 and 2)."""
    found = {}
    for fd in (1, 2):
        try:
            target = os.readlink("/proc/%d/fd/%d" % (pid, fd))
            st = os.stat("/proc/%d/fd/%d" % (pid, fd))
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        peer = peer_inode(st.st_ino)
        if not peer:
            continue
        try:
            with open("%s/%d:%s" % (STREAMS, st.st_dev, peer)) as f:
                for line in f:
                    if line.startswith("UNIT="):
                        found[peer] = line[5:].strip()
        except OSError:
            pass
    return found


def _proc(pid):
    """(real uid, cgroup paths, INVOCATION_ID) of a live process, or None.  The real uid, not the
    effective one: a user's setuid-root program is still that user's."""
    try:
        with open("/proc/%d/status" % pid) as f:
            uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
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


def attribute(pids, unit_names, runs=None, facts=None):
    """pid → the unit (among unit_names) whose run it belongs to, for the pids that have one;
    `runs`, if given, gets pid → "current" or "earlier".  `facts`: unit → its systemctl show
    properties when the caller has them (the same probe's): systemd is asked only for the others."""
    if not pids:
        return {}
    known = [Unit(n, (facts or {}).get(n)) for n in unit_names]
    out = {}
    for pid in pids:
        info = _proc(pid)
        for u in known if info else ():
            run = u.run_of(pid, *info)
            if run:
                out[pid] = u.name
                if runs is not None:
                    runs[pid] = run
                break
    return out


def title(pid):
    """The process's command line as one clean line (what ps shows)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return ""
    return " ".join(clean(raw.replace(b"\0", b" ").decode(errors="replace")).split())[:120]


def describe(pid, mib=None, unit=None):
    """A protocol.Process as a dict: what a person needs to recognise the process."""
    try:
        user = user_name(os.stat("/proc/%d" % pid).st_uid)
    except OSError:
        user = "?"
    return {"pid": pid, "title": title(pid), "user": user, "mib": mib, "unit": unit}


def starttime(pid):
    """When a live process started (clock ticks since boot); None when it is gone or a zombie.
    A reused PID has another start time."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        return None


def alive(pid):
    return starttime(pid) is not None


def catches(pid, sig):
    """Whether the process has a handler for `sig` (SigCgt in /proc/PID/status: bit sig - 1)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            mask = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
        return bool(int(mask, 16) >> (int(sig) - 1) & 1)
    except (OSError, StopIteration, IndexError, ValueError):
        return False


def send(pid, sig, unit):
    """Signal a process only while it is still the one attributed (pidfd pins its identity; on
    kernels or Pythons without pidfds, its start time must not change around the check)."""
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:
            fd = None  # ENOSYS: no pidfds on this kernel
    if fd is not None:
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
    born = starttime(pid)
    info = _proc(pid)
    if born is None or not info or not unit.owns(pid, *info) or starttime(pid) != born:
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

