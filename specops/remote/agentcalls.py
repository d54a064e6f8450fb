"""The agent's request envelope on a host's connection: the run's agent session (started with the
first request), each request encoded with the run's lock token (and a give-back), the requests
sent after it in the same round trip, the answers decoded; and a one-shot agent on a channel of
its own.  A mixin of ssh.Remote, which owns the connection it rides on."""
from __future__ import annotations

import json
from typing import Callable

from .. import protocol
from ..errors import NotStarted, SpecopsError
from . import shipping
from .session import AgentSession


class AgentCalls:
    """Requests to a host's agent; the class mixing it in gives `conn`, `name`, `become`, `open`,
    `exec` and the counters."""
    session: AgentSession | None = None
    not_started: NotStarted | None = None

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
        wires = [
            json.dumps(protocol.encode(r, unlock=unlock if i == 0 else None, lock=lock if i == 0 else None)).encode()
            for i, r in enumerate([request, *then])
        ]
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
