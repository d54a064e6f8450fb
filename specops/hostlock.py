"""The host lock as one run holds it, on the controller: who it says holds it (holder), its lease
and the thread that renews it while the run makes no requests, the probe's lock branch (taken,
refused, taken over), the envelope of every request (the token, which the agent checks before a
request that changes the host), giving it back (with the run's last request, on its own, after
Ctrl-C over a fresh connection), and keeping it across a body that must not lose it (a worker
out of its routers until it is back).  The agent's half is specops/agent/lock.py."""
from __future__ import annotations

import getpass
import os
import secrets  # the token: uuid would import platform, a few ms of every run's start
import socket
import threading
import time
from contextlib import contextmanager

from . import protocol
from .errors import SpecopsError
from .layout import LOCK_LEASE
from .remote.ssh import Remote


def lease() -> float:
    """How long a host lock stays held without a request of its run (SPECOPS_LOCK_LEASE seconds)."""
    return float(os.environ.get("SPECOPS_LOCK_LEASE") or LOCK_LEASE)


def holder(task: str) -> protocol.Holder:
    """Who holds a host's lock: shown to anyone refused by it."""
    return protocol.Holder(who=f"{getpass.getuser()}@{socket.gethostname()}", pid=os.getpid(), task=task,
                           since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), token=secrets.token_hex(16),
                           lease=lease())


def pids(running: list[int]) -> str:
    return ", ".join(f"pid {p}" if p else "pid not shown" for p in running)


class HostLock:
    """One run's hold on its host's lock.  `token` is set while the run holds it."""

    def __init__(self, run):
        self.run = run
        self.token: str | None = None
        self.last_call = time.monotonic()
        self._kept = 0  # bodies that keep it past a "last" request (rolling.py nests two)

    def ask(self, wants: protocol.Probe) -> None:
        """Make the probe `wants` take the lock.  The token is known before the probe answers, so a
        probe that fails after taking it gives it back."""
        opts = self.run.opts
        wants.lock_acquire, wants.break_lock = holder(opts.task), opts.break_lock
        self.token = wants.lock_acquire.token

    def not_asked(self) -> None:
        """The probe that would have taken it never reached the host."""
        self.token = None

    def answered(self, got: dict) -> None:
        """The probe's answer on the lock: held now (a take-over said), or refused, naming the holder."""
        name = self.run.host.name
        if not got["acquired"]:
            self.token = None
            h = got["holder"]
            if got.get("running"):
                raise SpecopsError(f"{name}: commands an earlier run started are still running there "
                                   f"({pids(got['running'])}); the host lock waits for them to end "
                                   f"(--break-lock goes ahead anyway)")
            raise SpecopsError(f"{name}: locked by {h.get('who', '?')} (pid {h.get('pid', '?')}, "
                               f"task {h.get('task', '?')}, since {h.get('since', '?')}); "
                               f"wait for it, or use --break-lock if it is gone")
        self.token = got["token"]
        if got.get("took_over"):
            t = got["took_over"]
            self.run.say(f"took over the lock of {t.get('who')} (pid {t.get('pid')}, task {t.get('task')}): "
                         f"{t['reason']}")
        if got.get("still_running"):
            self.run.say(f"WARNING: --break-lock: commands an earlier run started still run there "
                         f"({pids(got['still_running'])})")
        LeaseKeeper(self).start()

    def envelope(self, last: bool) -> dict:
        """The lock fields of a request: its token, and with `last` (unless kept) the give-back."""
        self.last_call = time.monotonic()
        return {"lock": self.token, "unlock": self.token if last and not self._kept else None}

    def sent_last(self, last: bool) -> None:
        if last and not self._kept:
            self.token = None

    @contextmanager
    def kept(self):
        """The lock stays with the run through the block, whatever request says it is the last."""
        self._kept += 1
        try:
            yield
        finally:
            self._kept -= 1

    def keeping(self) -> bool:
        """Inside kept(): a call that says it is the last is not."""
        return bool(self._kept)

    def release(self) -> None:
        """Give it back now (unless kept), in a request of its own."""
        if self.token and not self._kept:
            res = self.run.call(protocol.Unlock(token=self.token), last=True)
            if res.running:
                self.run.say(f"lock kept: commands of this run still run there ({pids(res.running)}); the next "
                             f"run waits for them")

    def release_interrupted(self) -> None:
        """After Ctrl-C (the run's session closed): give it back over a fresh connection."""
        if not self.token:
            return
        token, self.token = self.token, None
        run = self.run
        try:
            fresh = Remote(run.host.name, run.host.vars, run.opts.accept_new)
            res = fresh.agent(protocol.Unlock(token=token))
            fresh.close()
            run.say("interrupted: lock released" if res.released else
                    f"interrupted: lock kept: commands of this run still run there ({pids(res.running)})"
                    if res.running else "interrupted: the lock was no longer this run's")
        except Exception as e:  # the host may be what hung; say so and go on
            run.say(f"interrupted: could not release the lock: {e}")


class LeaseKeeper(threading.Thread):
    """Renews the lease while the run holds the lock and makes no requests (a long verify, a GPU
    window's job), over a channel of its own."""

    def __init__(self, lock: HostLock):
        super().__init__(daemon=True, name=f"lease-{lock.run.host.name}")
        self.lock = lock

    def run(self) -> None:
        every = lease() / 3
        while self.lock.token:
            time.sleep(min(5.0, every))
            token = self.lock.token
            if token and time.monotonic() - self.lock.last_call >= every:
                try:
                    self.lock.run.remote.agent_once(protocol.Renew(token=token))
                    self.lock.last_call = time.monotonic()
                except Exception:  # the run's own next request says what is wrong
                    pass
