"""Fabric connections to the hosts: each hop's host key checked (hostkeys.py), root through
become, and a counted exec, push and streaming exec; the agent's requests ride on it
(agentcalls.py)."""
from __future__ import annotations

import functools
import os
import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

import paramiko
from fabric import Config, Connection

from . import become as become_mod, shipping
from ..errors import HostKeyError, NotStarted, SpecopsError
from ..layout import WINDOW_STOP_SEC
from .agentcalls import AgentCalls
from .hostkeys import USER_KNOWN_HOSTS, check_host_keys, fingerprint
from .session import OUTPUT_LIMIT, AgentSession


def opens(method):
    """Connect first if needed (Fabric's own idiom): each call is then one counted round trip."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if not self.conn.is_connected:
            self.open()
        self.round_trips += 1
        return method(self, *args, **kwargs)
    return wrapper


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


class Remote(AgentCalls):
    """One host: a Fabric Connection plus the counted exec specops builds on (and, mixed in,
    the agent's requests over it: agentcalls.py)."""

    def __init__(self, name: str, vars: dict, accept_new: bool = False):
        self.name = name
        self.round_trips = 0
        self.session: AgentSession | None = None  # the run's agent on this host, once started
        self.followed: list = []  # what the requests sent after the last one did (agent's `then`)
        self.not_started: NotStarted | None = None  # why the agent could not start: never asked twice
        self.interrupted = False  # set when Ctrl-C was passed to a streamed job
        port = vars.get("ssh_port")
        # Without an address the name is an ssh_config alias (HostName, User, Port, IdentityFile).
        ssh_config = vars.get("ssh_config")
        config = Config(runtime_ssh_path=os.path.expanduser(ssh_config)) if ssh_config else Config()
        kwargs = {}
        if vars.get("ssh_key"):
            kwargs["key_filename"] = os.path.expanduser(vars["ssh_key"])
        self.conn = Connection(vars.get("address") or name, user=vars.get("ssh_user"), port=port,
                               config=config, connect_timeout=vars.get("connect_timeout", 10),
                               connect_kwargs=kwargs)
        self.become = become_mod.for_host(vars)  # how this host's commands become root
        user_file = os.path.expanduser(vars.get("known_hosts") or USER_KNOWN_HOSTS)
        accept = accept_new or vars.get("host_key_policy") == "accept-new"
        # Every hop checks its host key the same way: the target, and each ProxyJump gateway
        # (which Fabric would otherwise connect with paramiko's AutoAddPolicy).
        hop = self.conn
        while isinstance(hop, Connection):
            check_host_keys(hop.client, name if hop is self.conn else f"{name} (via {hop.host})",
                             user_file, accept)
            hop = hop.gateway

    def open(self) -> None:
        try:
            self.conn.open()
        except paramiko.BadHostKeyException as e:
            raise HostKeyError(
                f"{self.name}: host key CHANGED for {e.hostname}: got {fingerprint(e.key)}, "
                f"expected {fingerprint(e.expected_key)}; if the host was rebuilt, remove the old "
                f"key with ssh-keygen -R {e.hostname} and accept the new one") from None
        except HostKeyError:
            raise
        except (socket.timeout, TimeoutError):
            raise SpecopsError(f"{self.name}: SSH connect to {self.conn.host}:{self.conn.port} "
                               f"timed out") from None
        except (OSError, paramiko.SSHException) as e:
            raise SpecopsError(f"{self.name}: SSH to {self.conn.user}@{self.conn.host}:"
                               f"{self.conn.port} failed: {e}") from None

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        self.conn.close()

    def _root(self, command: str, pty: bool = False):
        """A channel running `command` as root (through sudo on a become host) and what it wrote first."""
        return become_mod.start(self.conn.client.get_transport(), command, self.become, self.name,
                                self.conn.user, pty)

    @opens
    def exec(self, command: str, stdin: bytes = b"", on_stderr: Callable[[str], None] | None = None,
             timeout: float | None = None, as_login: bool = False) -> Result:
        """Run one command as root (as_login: as the login user, with its own rights only) over a
        fresh channel: this is one round trip."""
        chan, early = (become_mod.start(self.conn.client.get_transport(), command, become_mod.Become(),
                                        self.name, self.conn.user) if as_login else self._root(command))
        if stdin:
            sender = threading.Thread(target=lambda: (chan.sendall(stdin), chan.shutdown_write()),
                                      daemon=True)
            sender.start()
        else:
            chan.shutdown_write()
        out, err, pending, kept = [], [early], b"", len(early)
        if on_stderr and early:
            *lines, pending = early.split(b"\n")
            for line in lines:
                on_stderr(line.decode(errors="replace"))
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            if deadline and time.monotonic() > deadline:
                become_mod.close_channel(chan)
                raise SpecopsError(f"{self.name}: {command[:60]} timed out after {timeout:.0f}s")
            select.select([chan], [], [], 0.2)
            while chan.recv_ready():
                out.append(chan.recv(1 << 16))
                kept += len(out[-1])
            while chan.recv_stderr_ready():
                data = chan.recv_stderr(1 << 16)
                err.append(data)
                kept += len(data)
                if on_stderr:
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        on_stderr(line.decode(errors="replace"))
            if kept > OUTPUT_LIMIT:
                become_mod.close_channel(chan)
                raise SpecopsError(f"{self.name}: {command[:60]} wrote more than {OUTPUT_LIMIT >> 20} MiB")
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if chan.closed and not chan.recv_ready():
                break
        rc = chan.recv_exit_status()
        become_mod.close_channel(chan)
        if on_stderr and pending:
            on_stderr(pending.decode(errors="replace"))
        return Result(rc, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"))

    @opens
    def push(self, local: str, remote: str, progress: Callable[[int, int], None] | None = None,
             offset: int = 0) -> int:
        """Upload a file as root (as remote.part, renamed only when whole; from `offset` on, to
        resume a cut push); returns the bytes sent."""
        total = os.path.getsize(local)
        with open(local, "rb") as f:  # a local error is ours, said before anything starts there
            f.seek(offset)
            chan, early = self._root(shipping.receive_command(remote, total, offset))
            sent, err = offset, early
            try:
                while block := f.read(1 << 20):
                    try:
                        chan.sendall(block)
                    except OSError:
                        break  # the receiver stopped reading: its own words say why, below
                    sent += len(block)
                    if progress:
                        progress(sent, total)
                else:
                    chan.shutdown_write()
                rc = chan.recv_exit_status()
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
            finally:
                become_mod.close_channel(chan)
        if rc != 0:
            raise SpecopsError(f"{self.name}: push of {remote} failed: "
                               f"{err.decode(errors='replace').strip()[-300:] or f'exit {rc}'}")
        return sent - offset

    @opens
    def stream(self, command: str, on_line: Callable[[str], None], root: bool = False,
               scope: str | None = None) -> int:
        """Run a job on a pty, streaming its output; Ctrl-C here is Ctrl-C there.  Returns its status.
        It runs as the login user, or as root with root=True.  With `scope`, in that transient
        scope (made as root, so the job, and all it starts, can be ended with it: agent/services/window.py)."""
        # Killed by a signal, a job has no exit status, only an exit-signal, which paramiko
        # drops.  A wrapper that survives SIGINT (a no-op trap resets to default in the job)
        # reports the job's status as 128+signal, the way a shell does.
        wrapper = 'trap : INT TERM HUP; bash -c "$1"; exit $?'
        job = f"bash -c {shlex.quote(wrapper)} specops-job {shlex.quote(command)}"
        if scope:
            as_user = [] if root or not self.become.active else [f"--uid={self.conn.user}"]
            # exec: the wrapper takes the place of sudo's shell, which Ctrl-C would kill, and sudo
            # with it (no exit status then, only a signal)
            job = "exec " + shlex.join(["systemd-run", "--scope", "--quiet", "--collect", f"--unit={scope}",
                                        f"--property=TimeoutStopSec={WINDOW_STOP_SEC}", *as_user, "--"]) + " " + job
            root = True  # only root makes a system unit; --uid runs the job as the login user
        if root:
            chan, pending = self._root(job, pty=True)
        else:
            chan, pending = self.conn.client.get_transport().open_session(), b""
            chan.get_pty(width=200)
            chan.exec_command(job)
        self.interrupted = False
        *early, pending = pending.replace(b"\r\n", b"\n").split(b"\n")
        for line in early:
            on_line(line.decode(errors="replace"))
        while True:
            try:
                select.select([chan], [], [], 0.2)
                while chan.recv_ready():
                    pending += chan.recv(1 << 16)
                    *lines, pending = pending.replace(b"\r\n", b"\n").split(b"\n")
                    if len(pending) > 1 << 16:  # a line without end: show it in pieces, keep nothing
                        lines.append(pending)
                        pending = b""
                    for line in lines:
                        on_line(line.decode(errors="replace"))
                if chan.exit_status_ready() and not chan.recv_ready():
                    break
            except KeyboardInterrupt:
                if self.interrupted:
                    raise
                self.interrupted = True
                chan.send(b"\x03")  # the remote tty turns it into SIGINT for the job
        if pending:
            on_line(pending.decode(errors="replace"))
        status = chan.recv_exit_status()
        become_mod.close_channel(chan)
        return status
