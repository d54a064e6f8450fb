"""Commands the agent starts end with the request that started them, however it ends, and the
host lock waits for them (agent/children.py, agent/host.py, agent/lock.py).  Real processes, no fleet: the agent's
own module in a child python, its stdout a pipe that the test closes as sshd does when the
controller's channel goes."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specops import protocol
from specops.agent import children, host, lock

ROOT = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def agent_running(tmp_path, command: str) -> subprocess.Popen:
    """A python that does what the agent does on a request (die_with_connection, then a quiet
    command that ignores SIGTERM and writes nothing), its stdout a pipe to this test."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from specops.agent import children, host
        children.CHILDREN_LOCK, children.CHILD_GRACE = {str(tmp_path / "children")!r}, 0.5
        children.state.update(locked=True, busy=True)  # as main.answer sets them for a locked request
        host.die_with_connection(sys.stdout.buffer)
        host.run_owned(["sh", "-c", {command!r}])
    """)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(path: Path, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return int(path.read_text())


def test_a_quiet_command_ends_when_the_channel_goes(tmp_path, monkeypatch):
    """Issue 23, item 4: a download writes nothing while it runs, so nothing told the agent that
    the controller had gone, and it ran on after the lock was given back.  Seen red without the
    channel watcher: the command was still running 10 s after the channel closed."""
    pidfile = tmp_path / "pid"
    agent = agent_running(tmp_path, f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done")
    pid = wait_for(pidfile)
    monkeypatch.setattr(lock, "CHILDREN_LOCK", str(tmp_path / "children"))
    assert pid in lock.running()  # it (and what it started) holds the children's flock while it lives
    agent.stdout.close()  # the controller's end of the channel goes
    try:
        assert agent.wait(10) == 130, agent.stderr.read()
        assert not alive(pid)  # it ignored SIGTERM: SIGKILL after the grace, reaped before the agent exits
        assert lock.running() == []
    finally:  # a failure leaves nothing running
        agent.kill()
        subprocess.run(["pkill", "-KILL", "-s", str(pid)])


def test_what_a_command_started_in_its_session_ends_with_it(tmp_path):
    """A grandchild in the command's session (pip's build, rsync's ssh) goes with it, also when
    the command itself has already exited."""
    pidfile = tmp_path / "pid"
    proc = children.spawn(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; exit 0"])
    grandchild = wait_for(pidfile)
    proc.wait()
    assert alive(grandchild)
    children.end([proc])
    time.sleep(0.2)
    assert not alive(grandchild)


def holder(token):
    return protocol.Holder(who=f"{token}@here", pid=1, task="deploy", since="now", token=token, lease=120.0)


def test_the_lock_is_neither_given_back_nor_taken_while_a_command_of_the_run_lives(tmp_path, monkeypatch):
    """Seen red with release() not waiting for the children's flock: the lock was given back at
    once while the command ran on."""
    for name in ("LOCK_DIR", "LOCK_GUARD"):
        monkeypatch.setattr(lock, name, str(tmp_path / name))
    monkeypatch.setattr(lock, "LOCK_HOLDER", str(tmp_path / "LOCK_DIR" / "holder.json"))
    monkeypatch.setattr(lock, "CHILDREN_LOCK", str(tmp_path / "children"))
    monkeypatch.setattr(children, "CHILDREN_LOCK", str(tmp_path / "children"))
    monkeypatch.setitem(children.state, "locked", True)
    monkeypatch.setattr(lock, "RELEASE_WAIT", 0.5)
    assert lock.acquire(protocol.Holder(**{**protocol.to_dict(holder("a")), "lease": 0.0}))["acquired"]
    proc = children.spawn(["sleep", "60"])
    try:
        assert lock.release("a") == (False, [proc.pid])
        assert os.path.isdir(lock.LOCK_DIR)
        refused = lock.acquire(holder("b"))  # a's lease has run out: taken over, but not while its command runs
        assert refused["acquired"] is False and refused["running"] == [proc.pid]
        broken = lock.acquire(holder("c"), take_over=True)  # --break-lock goes ahead, and says so
        assert broken["acquired"] and broken["still_running"] == [proc.pid]
    finally:
        children.end([proc])
    assert lock.release("c") == (True, [])


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_agent_ends_its_commands_first(tmp_path, signal_name):
    pidfile = tmp_path / "pid"
    agent = agent_running(tmp_path, f"trap '' TERM HUP; echo $$ > {pidfile}; while :; do sleep 0.1; done")
    pid = wait_for(pidfile)
    import signal
    try:
        agent.send_signal(getattr(signal, signal_name))
        assert agent.wait(10) == 130
        assert not alive(pid)
    finally:  # a failed run leaves nothing behind: the command ignores TERM and HUP
        agent.kill()
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_command_of_a_request_without_the_lock_never_makes_a_run_wait(tmp_path, monkeypatch):
    """A check-mode preflight holds no host lock: its validator must not make another run's
    lock wait, or be refused as 'an earlier run's command'."""
    monkeypatch.setattr(children, "CHILDREN_LOCK", str(tmp_path / "children"))
    monkeypatch.setattr(lock, "CHILDREN_LOCK", str(tmp_path / "children"))
    monkeypatch.setitem(children.state, "locked", False)
    proc = children.spawn(["sleep", "60"])
    try:
        assert lock.running() == []
    finally:
        children.end([proc])


@pytest.mark.parametrize("channel", ["pipe", "file"])
def test_the_kernel_signals_the_agent_when_its_parent_goes_where_no_watcher_sees_the_channel(tmp_path, channel):
    """On sshd's pipes (or socket) the watcher sees sshd go, as it sees the channel close: no
    PR_SET_PDEATHSIG, nor ctypes imported for it (~1 ms of every call).  On anything else (a
    terminal, a file) the kernel sends SIGTERM when the parent goes."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from specops.agent import host
        host.die_with_connection(sys.stdout.buffer)
        loaded = "ctypes" in sys.modules
        import ctypes
        sig = ctypes.c_int()
        ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
        sys.stderr.write("%d %s" % (sig.value, loaded))
    """)
    out = subprocess.PIPE if channel == "pipe" else open(tmp_path / "out", "wb")
    res = subprocess.run([sys.executable, "-I", "-S", "-c", script], stdout=out, stderr=subprocess.PIPE, text=True)
    assert res.stderr == ("0 False" if channel == "pipe" else "15 True")
