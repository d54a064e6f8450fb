"""Fabric connections that check host keys, and a counted, streaming exec.

Fabric's Connection installs paramiko's AutoAddPolicy, which trusts any key.
We load the system and user known_hosts files and install our own policy:
unknown keys are refused unless accept-new was asked for, in which case the
key is recorded; changed keys are always refused (paramiko raises
BadHostKeyException for those before any policy is consulted).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import paramiko
from fabric import Config, Connection

from . import become as become_mod, shipping
from .. import protocol
from ..errors import HostKeyError, NotStarted, SpecopsError
from ..layout import WINDOW_STOP_SEC
from .session import OUTPUT_LIMIT, AgentSession

SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
USER_KNOWN_HOSTS = os.path.expanduser("~/.ssh/known_hosts")


def opens(method):
    """Connect first if needed (Fabric's own idiom): each call is then one counted round trip."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if not self.conn.is_connected:
            self.open()
        self.round_trips += 1
        return method(self, *args, **kwargs)
    return wrapper


def _check_host_keys(client: paramiko.SSHClient, name: str, user_file: str, accept: bool) -> None:
    if os.path.exists(SYSTEM_KNOWN_HOSTS):
        client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
    if os.path.exists(user_file):
        client.load_host_keys(user_file)
    # load_host_keys would make paramiko rewrite the file on save; we only append.
    client._host_keys_filename = None
    client.set_missing_host_key_policy(_Policy(name, accept, user_file))


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _Policy(paramiko.MissingHostKeyPolicy):
    """Unknown keys: refused, or (accept-new) recorded.  paramiko names the host as known_hosts
    does already ("[host]:port" off port 22), so that name is recorded as it is."""

    def __init__(self, name: str, accept_new: bool, record_to: str):
        self.name, self.accept_new, self.record_to = name, accept_new, record_to

    def missing_host_key(self, client, hostname, key):
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostKeyError(
                f"{self.name}: unknown host key {key.get_name()} {fp} for {hostname}; check it, "
                f"then accept it with --accept-new-host-key or host_key_policy: accept-new")
        Path(self.record_to).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.record_to, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


class Remote:
    """One host: a Fabric Connection plus the counted exec specops builds on."""

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
            _check_host_keys(hop.client, name if hop is self.conn else f"{name} (via {hop.host})",
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

    def agent(self, request, unlock: str | None = None, lock: str | None = None,
              on_stderr: Callable[[str], None] | None = None, then: list = ()):
        """One protocol request to this host's agent (started with the first): one round trip.
        `lock`: the run's lock token (the request runs only while it holds the lock); `unlock`:
        give the lock back when the request ends.  `then`: requests sent in the same round trip
        after it, without the lock; their results (or the SpecopsError each met) are left in
        self.followed."""
        self.followed = []
        if self.not_started:
            raise self.not_started
        if not self.conn.is_connected:
            self.open()
        if self.session is None:
            try:
                self.session = AgentSession(self.name, self.conn.client.get_transport(), self.become, self.conn.user)
            except SpecopsError as e:  # a refused sudo must not be asked again (by the lock's give-back)
                self.not_started = NotStarted(str(e))
                raise self.not_started from None
        self.round_trips += 1
        # `then` goes without the lock (protocol.changes_host is false for it), after the lock is
        # given back: a slow one cannot keep the host locked, nor be refused after an Unlock
        wires = [json.dumps(protocol.encode(r, unlock=unlock if i == 0 else None, lock=lock if i == 0 else None)).encode()
                 for i, r in enumerate([request, *then])]
        try:
            answer, *followed = self.session.call(wires[0], on_stderr, wires[1:])
        except SpecopsError:
            self.session = None
            raise
        except BaseException:  # mid-request (Ctrl-C, or a progress line that could not be written: a
            # closed stdout, `inv deploy | head`): its answer would be taken for the next one's
            self.session.close()   # (this also ends the agent and what it was running)
            self.session = None
            raise
        self.followed = []
        for r, raw in zip(then, followed):
            try:
                self.followed.append(self._decode(r, raw))
            except SpecopsError as e:
                self.followed.append(e)
        return self._decode(request, answer)

    def _decode(self, request, answer: bytes):
        try:
            return protocol.decode_result(request, json.loads(answer))
        except protocol.AgentError as e:
            raise SpecopsError(f"{self.name}: {e}") from None
        except (protocol.ProtocolError, ValueError) as e:
            raise SpecopsError(f"{self.name}: the agent's answer is not understood: {e}") from None

    def agent_once(self, request):
        """A request to a one-shot agent on its own channel (while the session may be busy)."""
        res = self.exec(shipping.COMMAND, shipping.payload(json.dumps(protocol.encode(request)).encode()))
        size, _, body = res.stdout.partition("\n")
        if res.rc != 0 or not size.strip().isdigit():
            raise SpecopsError(f"{self.name}: remote agent failed (exit {res.rc})")
        return protocol.decode_result(request, json.loads(body[:int(size)]))
