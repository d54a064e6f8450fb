"""Becoming root on a host that refuses root logins: sudo, with or without a password.

Without a password: `sudo -n`, which fails at once if one is needed.  With one: `sudo -S -p
PROMPT`, and the password goes on the channel's stdin only when PROMPT appears (sudo needs none
when it remembers an earlier one on the same connection, or for NOPASSWD: then nothing is sent,
so the command can never read it).  The command first says it started (READY), and the
controller sends anything else only after that, so sudo never takes our data for a second
attempt: a second PROMPT is a refusal, and the channel is closed.  On a pty (a gpu-window job
run with --become) sudo asks on the terminal with echo off.  Only what comes before READY is
sudo's, so only that is read for sudo's refusals.  The password
never appears in an argv, a log line or a report (it is one of the Redactor's secrets).
"""
from __future__ import annotations

import getpass
import os
import select
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field

from ..errors import SpecopsError, UsageError

READY = "specops-became-root"
PROMPT = "specops-sudo-password:"
ANSWER_WITHIN = 60  # seconds sudo has to say yes or no
ENV = "SPECOPS_BECOME_PASS"
_password: str | None = None  # asked once per run


@dataclass(frozen=True)
class Become:
    """How a host's commands become root: not at all, sudo -n, or sudo with a password."""
    method: str | None = None        # None: we log in as root
    password: str | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.method is not None

    def wrap(self, command: str, pty: bool = False) -> str:
        """The command, run as root; once it runs, it says READY (on stderr, or on the terminal).
        With a password, sudo asks with PROMPT (on stderr; on a pty, the terminal with echo off)."""
        if not self.active:
            return command
        announced = shlex.quote(f"echo {READY} >&2; {command}")  # a shell line too, so no exec
        if self.password is None:
            return f"sudo -n -- sh -c {announced}"
        return f"sudo {'' if pty else '-S '}-p {PROMPT} -- sh -c {announced}"

    def stdin_prefix(self) -> bytes:
        return (self.password + "\n").encode() if self.password is not None else b""


def start(transport, command: str, become: Become, host: str, user: str | None,
          pty: bool = False) -> tuple[object, bytes]:
    """A channel running `command` as root, past sudo.  The password is sent only when sudo asks
    for it (not when it needs none, or remembers an earlier one), once; a second question is a
    refusal.  Returns the channel and what the command wrote after READY."""
    chan = transport.open_session()
    try:
        if pty:
            chan.get_pty(width=200)
        chan.exec_command(become.wrap(command, pty))
        if not become.active:
            return chan, b""
        return chan, _past_sudo(chan, become, host, user, pty)
    except BaseException:
        close_channel(chan)  # a refusal, a timeout or Ctrl-C: nothing more reaches sudo or the command
        raise


def close_channel(chan) -> None:
    """Close a channel that may still be receiving, leaving the connection usable.

    We wait on channels with select(), so paramiko feeds each one through an OS pipe.  Its
    close() shuts that pipe while its transport thread may still be writing to it (paramiko
    #2271): the write fails with EBADF and kills the whole connection (seen in CI when a command's
    output passed the cap).  Pointing both buffers at a plain event first, under the buffers' own
    locks, ends the pipe's writers before the pipe goes.  A connection already dead has nothing
    left to close; the caller's own error says why."""
    detached = threading.Event()
    chan.in_buffer.set_event(detached)
    chan.in_stderr_buffer.set_event(detached)
    try:
        chan.close()
    except (EOFError, OSError):
        pass


def _past_sudo(chan, become: Become, host: str, user: str | None, pty: bool) -> bytes:
    seen, asked = b"", 0
    deadline = time.monotonic() + ANSWER_WITHIN
    while time.monotonic() < deadline:
        select.select([chan], [], [], 0.2)
        while chan.recv_ready() if pty else chan.recv_stderr_ready():
            seen += chan.recv(1 << 16) if pty else chan.recv_stderr(1 << 16)
        if READY.encode() in seen:
            return seen.split(READY.encode(), 1)[1].lstrip(b"\r\n")
        if PROMPT.encode() in seen:
            asked += 1
            if asked > 1 or become.password is None:
                raise refusal(host, user)
            seen = seen.replace(PROMPT.encode(), b"", 1)
            chan.sendall(become.stdin_prefix())
        text = seen.decode(errors="replace")
        refused = failure(host, user, text, had_password=asked > 0)
        if refused:
            raise refused
        # All of sudo's words are in only once the host has sent its end of file: its exit status
        # can come first (seen in CI: "sudo failed: sudo", the rest of its line still on the way).
        if chan.exit_status_ready() and chan.eof_received and not (chan.recv_ready() or chan.recv_stderr_ready()):
            raise SpecopsError(f"{host}: sudo failed: {text.strip()[-200:] or 'no output'}")
    raise SpecopsError(f"{host}: sudo did not say yes or no within {ANSWER_WITHIN} s "
                       f"(it said: {seen.decode(errors='replace').strip()[-120:] or 'nothing'})")


def refusal(host: str, user: str | None) -> SpecopsError:
    return SpecopsError(f"{host}: sudo refused the become password for {user} (one attempt, no retry)")


def ask_password(prompt: str = "BECOME password: ") -> None:
    """--ask-become-pass: one prompt per run, without echo (a line on stdin when it is no terminal)."""
    global _password
    if sys.stdin.isatty():
        _password = getpass.getpass(prompt)
    else:
        _password = sys.stdin.readline().rstrip("\n")
    if not _password:
        raise UsageError("--ask-become-pass: no password given")


def for_host(host_vars: dict) -> Become:
    if not host_vars.get("become"):
        return Become()
    method = host_vars.get("become_method", "sudo")
    if method != "sudo":
        raise UsageError(f"become_method {method!r} is not supported (sudo is)")
    return Become("sudo", _password if _password is not None else os.environ.get(ENV) or None)


def password() -> str | None:
    """The become password of this run, if there is one (for the Redactor)."""
    return _password if _password is not None else os.environ.get(ENV) or None


def failure(host: str, user: str | None, stderr: str, had_password: bool) -> SpecopsError | None:
    """sudo's refusal, as one line naming the host, or None if the text is not one."""
    text = stderr.lower()
    if "a password is required" in text or "a terminal is required" in text:
        return SpecopsError(f"{host}: sudo needs a password for {user} and none was given "
                            f"(use --ask-become-pass or {ENV})")
    if "incorrect password" in text or "sorry, try again" in text:
        return refusal(host, user)
    if "not in the sudoers file" in text or "may not run sudo" in text or "not allowed to execute" in text:
        return SpecopsError(f"{host}: {user} may not use sudo there (not in sudoers)")
    if "must have a tty" in text or "requiretty" in text:
        return SpecopsError(f"{host}: sudo there requires a tty (Defaults requiretty); allow {user} "
                            f"without one (Defaults:{user} !requiretty)")
    if had_password and "no password was provided" in text:
        return refusal(host, user)
    return None
