"""Who listens on a service's port: verify asks before any request carries the API key (a local
user could bind the port while the weights load, answer /health with 200, and collect the key)."""
import os

from specops.agent.procs import Unit, _proc, describe


def _listening(port):
    """Inodes of the TCP sockets listening on `port` (any address, IPv4 or IPv6)."""
    found = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, task)) as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _holding(pids, inodes):
    """pid → the inodes (of `inodes`) it has open."""
    out = {}
    for pid in pids:
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                out.setdefault(pid, set()).add(target[8:-1])
    return out


class Listener:
    """Who listens on a service's port, checked as often as asked: the unit is read once, and a
    socket already found in one of its processes is not looked for again."""

    def __init__(self, unit_name, port, props=None):
        self.unit_name, self.port = unit_name, port
        self.unit = Unit(unit_name, props)  # at most one systemctl call for the whole verify
        self.ours = set()            # listening inodes seen held by the unit's processes

    def problem(self):
        """None when whatever listens on the port belongs to the unit; else why not, in one line."""
        inodes = _listening(self.port)
        if not inodes:
            return "nothing listens on port %d" % self.port
        todo = inodes - self.ours
        if todo:
            held = _holding(_descendants(self.unit.main) if self.unit.main else [], todo)
            for pid, sockets in held.items():
                info = _proc(pid)
                if info and self.unit.owns(pid, *info):
                    self.ours |= sockets
            todo = inodes - self.ours
        if not todo:
            return None
        strangers = _holding([int(p) for p in os.listdir("/proc") if p.isdigit()], todo)
        if not strangers:
            return "port %d is held by a process specops cannot see" % self.port
        pid = sorted(strangers)[0]
        d = describe(pid)
        return "port %d is served by pid %d (user %s: %s), not by %s" % (self.port, pid, d["user"], d["title"],
                                                                        self.unit_name)
