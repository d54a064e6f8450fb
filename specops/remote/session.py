"""One agent per host and run: a process on the host that answers the run's requests in order
over one SSH channel.

Starting Python and importing the agent is most of a request's cost on the host; a deploy
makes two to four requests, so they share one agent.  Each request and each answer is a
frame (its length on a line, then the JSON); the agent's progress lines arrive on stderr
while a request runs.  Closing the session (or losing the connection) ends the agent.
"""
from __future__ import annotations

import select
from typing import Callable

from . import become as become_mod, shipping
from .. import memo
from .become import Become
from ..errors import SpecopsError

OUTPUT_LIMIT = 64 * 2**20  # what we keep of one answer or of a command's output


class AgentSession:
    def __init__(self, name: str, transport, become: Become = Become(), user: str | None = None):
        self.name, self.become, self.user = name, become, user
        self.chan, self.err = become_mod.start(transport, shipping.COMMAND, become, name, user)
        # Named by the host's own key: a host reinstalled, or another behind the same name, is new.
        self.served = memo.key(transport.get_remote_server_key().asbytes(), shipping.artifact()[1])
        self.new = memo.get("served", self.served) is None
        self.chan.sendall(shipping.preamble(with_compiled=self.new))
        self.out, self.tail = b"", []

    def call(self, wire: bytes, on_stderr: Callable[[str], None] | None = None, then: list[bytes] = ()) -> list[bytes]:
        """Send one request, and the requests `then` in the same write (the agent answers them in
        order: no round trip of their own); stream the progress lines; return the answers."""
        self.chan.sendall(b"".join(shipping.frame(w) for w in [wire, *then]))
        answers = [self._answer(on_stderr) for _ in range(1 + len(then))]
        if self.new:  # the agent runs there: its compiled zip is kept, or this host compiles its own
            memo.put("served", self.served, b"")
            self.new = False
        return answers

    def _answer(self, on_stderr: Callable[[str], None] | None) -> bytes:
        while True:
            answer = self._frame()
            if answer is not None:
                return answer
            if self.chan.exit_status_ready() and not self.chan.recv_ready() and not self.chan.recv_stderr_ready():
                lines = [t for t in self.tail + [self.err.decode(errors="replace").strip()] if t] or ["no output"]
                rc = self.chan.recv_exit_status()
                tail = lines[-1]
                if rc == 127 or "python3: not found" in tail or "command not found" in tail:
                    tail = "python3 is not installed on the host"
                raise SpecopsError(f"{self.name}: remote agent failed (exit {rc}): {tail}")
            select.select([self.chan], [], [], 0.2)
            while self.chan.recv_ready():
                self.out += self.chan.recv(1 << 16)
                if len(self.out) > OUTPUT_LIMIT:
                    self.close()
                    raise SpecopsError(f"{self.name}: the agent's answer is more than {OUTPUT_LIMIT >> 20} MiB")
            while self.chan.recv_stderr_ready():
                self.err += self.chan.recv_stderr(1 << 16)
                *lines, self.err = self.err.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    self.tail = (self.tail + [text])[-20:]
                    if on_stderr:
                        on_stderr(text)
                self.err = self.err[-OUTPUT_LIMIT:]

    def _frame(self) -> bytes | None:
        head, sep, rest = self.out.partition(b"\n")
        if not sep:
            return None
        size = int(head)
        if len(rest) < size:
            return None
        self.out = rest[size:]
        return rest[:size]

    def close(self) -> None:
        become_mod.close_channel(self.chan)
