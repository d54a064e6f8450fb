"""Who listens on a port: the kernel's sock_diag answer is /proc/net/tcp's, for much less CPU."""
import socket

from specops.agent.services import listeners


def _from_proc(port):
    found = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(path).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.add(f[9])
    return found


def test_sock_diag_finds_the_listeners_proc_lists(monkeypatch):
    v4 = socket.socket()
    v4.bind(("127.0.0.1", 0))
    v4.listen()
    port = v4.getsockname()[1]
    v6 = socket.socket(socket.AF_INET6)
    v6.bind(("::1", port))
    v6.listen()
    near = socket.socket()  # connected, not listening: not counted
    near.connect(("127.0.0.1", port))
    try:
        assert listeners._listening(port) == _from_proc(port) and len(_from_proc(port)) == 2
        calls = []
        monkeypatch.setattr(listeners, "_diag_listeners", lambda family: calls.append(family) or [])
        assert listeners._listening(port) == set() and calls  # the answer really is sock_diag's
        def refused(family):
            raise OSError("no netlink here")
        monkeypatch.setattr(listeners, "_diag_listeners", refused)
        assert listeners._listening(port) == _from_proc(port)  # and /proc when it is refused
    finally:
        for s in (near, v6, v4):
            s.close()
