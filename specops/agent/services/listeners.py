"""Who listens on a service's port: verify asks before any request carries the API key (a local
user could bind the port while the weights load, answer /health with 200, and collect the key)."""
import os
import struct

from specops.agent.lean import socket
from specops.agent.services.procs import Unit, _proc, describe


def _listening(port):
    """Inodes of the TCP sockets listening on `port` (any address, IPv4 or IPv6): asked of the
    kernel's sock_diag, which walks only the listening sockets; /proc/net/tcp (which walks every
    connection's hash bucket: milliseconds of CPU per read on a big machine) if that is refused."""
    try:
        return {str(inode) for family in (socket.AF_INET, socket.AF_INET6)
                for sport, inode in _diag_listeners(family) if sport == port}
    except OSError:
        pass
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


SOCK_DIAG_BY_FAMILY, NLMSG_ERROR, NLMSG_DONE, TCP_LISTEN = 20, 2, 3, 10


def _diag_listeners(family):
    """(port, inode) of every listening TCP socket of `family`, by one NETLINK_SOCK_DIAG dump
    (linux/inet_diag.h: an inet_diag_req_v2 asking for the LISTEN state only)."""
    req = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
    head = struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, 0x301, 1, 0)  # REQUEST | DUMP
    out = []
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)  # NETLINK_SOCK_DIAG
    try:
        nl.settimeout(5)
        nl.sendto(head + req, (0, 0))
        while True:
            data, at = nl.recv(65536), 0
            while at + 16 <= len(data):
                size, kind = struct.unpack_from("=IH", data, at)
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR or size < 16:
                    raise OSError("sock_diag refused the dump")
                sport, = struct.unpack_from(">H", data, at + 16 + 4)
                inode, = struct.unpack_from("=I", data, at + 16 + 68)
                out.append((sport, inode))
                at += (size + 3) & ~3
    finally:  # (the C socket, which lean gives, is no context manager)
        nl.close()


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
