"""The commands the agent starts (pip, the hub client, rsync, validators), which end with the
request that started them, however it ends.

Each runs in a session of its own, so it is stopped with everything it started there (SIGTERM,
SIGKILL after CHILD_GRACE).  While the request holds the host lock, each also holds a shared
flock on CHILDREN_LOCK through an fd that only it (and what inherits it) keeps: the lock is given
back, or taken over, only once none is left (agent/lock.py).  A request without the lock (a
check-mode preflight) leaves that flock alone, so it never makes a run wait.
"""
import os
import time

from specops.agent.lean import signal
from specops.layout import CHILD_GRACE, CHILDREN_LOCK

running = []  # what we started and have not ended
# Set by main.answer for the request being answered: does it hold the host lock; is one running.
state = {"locked": False, "busy": False}


def hold():
    """A new fd holding a shared flock on CHILDREN_LOCK (released when every copy of it closes)."""
    import fcntl
    fd = os.open(CHILDREN_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def spawn(argv, pass_fds=(), **popen):
    """Popen, in a session of its own; with the flock while the request holds the host lock."""
    import subprocess  # only a request that starts a command imports it (not a no-op's)
    fd = hold() if state["locked"] else None
    try:
        proc = subprocess.Popen(
            argv, start_new_session=True, pass_fds=tuple(pass_fds) + ((fd,) if fd is not None else ()), **popen
        )
    finally:
        if fd is not None:
            os.close(fd)
    running.append(proc)
    return proc


def _signal_session(proc, sig):
    try:
        os.killpg(proc.pid, sig)  # its session's group: the pgid stays its own while a member is left
    except OSError:
        pass


def _reaped(proc):
    """Whether a command has exited (reaped here without Popen's lock: a signal handler that
    interrupted Popen.wait must not wait on that lock)."""
    if proc.returncode is not None:
        return True
    try:
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:
        pid, status = proc.pid, 0
    if pid:
        proc.returncode = -(status & 0x7f) if status & 0x7f else status >> 8
    return bool(pid)


def _wait(procs, seconds):
    deadline = time.monotonic() + seconds
    live = [p for p in procs if not _reaped(p)]
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [p for p in live if not _reaped(p)]
    return live


def end(procs):
    """Stop commands we started, and what they started in their sessions: SIGTERM, SIGKILL after
    CHILD_GRACE, each reaped (one stuck in the kernel for another CHILD_GRACE is left: it keeps
    the flock, so the host lock stays held and says so)."""
    live = [p for p in procs if not _reaped(p)]
    for p in live:
        _signal_session(p, signal.SIGTERM)
    live = _wait(live, CHILD_GRACE)
    for p in procs:
        _signal_session(p, signal.SIGKILL)  # what it left in its session, and itself if still there
    _wait(live, CHILD_GRACE)
    for p in procs:
        if p in running:
            running.remove(p)
