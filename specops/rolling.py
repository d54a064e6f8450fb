"""Deploying a worker that serves behind SGLang's router without dropping a request.

Around one host's deploy, for each router of the inventory that routes to its services:
before the first change reaches the host, take its workers out of the router and wait until
each has no request in flight; after the deploy verified (or, when it failed, after the host is
back on a release that verifies), put them back and wait until the router says they are
healthy.  A host whose deploy changes nothing is never taken out; one that does not verify is
left out, and says so.  With `--serial N`, the engine's rolling batches make this a rolling
deploy: the hosts not yet reached keep serving.
"""
from __future__ import annotations

from . import protocol, services
from . import verify as verify_mod
from .errors import SpecopsError
from .run import HostRun
from .services.router import Worker, routers_of
from .ssh import Remote

DRAIN_TIMEOUT = 120  # seconds a worker may take to finish what it was serving (a service's drain_timeout)


class Membership:
    """This host's workers in the routers that route to it, and the connections to those routers."""

    def __init__(self, run: HostRun):
        self.run = run
        inv = run.host.inventory
        self.routes = routers_of(inv, run.host.name) if inv else []
        self.out: list[tuple[object, protocol.ServiceCheck, Worker]] = []
        self.remotes: dict[str, Remote] = {}

    def _call(self, router_host, request):
        remote = self.remotes.get(router_host.name)
        if remote is None:
            remote = self.remotes[router_host.name] = Remote(router_host.name, router_host.vars, self.run.opts.accept_new)
        return remote.agent(request, on_stderr=lambda line: self.run.say(line.strip()))

    def take_out(self) -> None:
        """Out of every router, then idle (or a failure: what was taken out goes back)."""
        for router_host, svc, workers in self.routes:
            check = services.kind_of(svc).check(router_host, svc)
            for w in workers:
                # Counted as out before asking: a removal the router took but we did not hear the end
                # of (a timeout, a lost link, Ctrl-C) is still put back.
                self.out.append((router_host, check, w))
                res = self._call(router_host, protocol.RouterRemove(router=check, url=w.url))
                if res.absent:
                    self.out.pop()
                    self.run.say(f"router {router_host.name}/{svc['name']} is not running: nothing to take "
                                 f"{w.service} out of")
                    continue
                self.run.say(f"{w.service} is out of router {router_host.name}/{svc['name']}")
        checks = {c.name: c for c in services.checks(self.run.host)}
        timeouts = {s["name"]: s.get("drain_timeout", DRAIN_TIMEOUT) for _, s in services.of_host(self.run.host)}
        for name in dict.fromkeys(w.service for _, _, w in self.out):
            res = self.run.call(protocol.WorkerIdle(service=checks[name], timeout=timeouts[name]),
                                on_stderr=lambda line: self.run.say(line.strip()))
            if not res.idle:
                raise SpecopsError(f"{name} still has {res.running} running and {res.waiting} waiting request(s) "
                                   f"after {res.waited:.0f} s out of the router; not deployed")

    def put_back(self) -> None:
        for router_host, check, w in self.out:
            res = self._call(router_host, protocol.RouterAdd(router=check, url=w.url))
            self.run.say(f"{w.service} is back in router {router_host.name}/{check.name}, healthy" if not res.absent
                         else f"router {router_host.name}/{check.name} is not running: {w.service} not put back")
        self.out = []

    def close(self) -> None:
        for remote in self.remotes.values():
            remote.close()


def deploy(run: HostRun, body, drain: bool = True) -> None:
    """`body(run)` (pipeline.deploy) with this host's workers out of their routers while it changes."""
    member = Membership(run) if drain else None
    if not member or not member.routes:
        return body(run)
    run.before_change = member.take_out
    run.keep_lock = True  # until the worker is back: another run must not drain it meanwhile
    ok = False
    try:
        body(run)
        ok = True
    finally:
        run.before_change, run.keep_lock = None, False
        try:
            if member.out:
                if ok or _verifies(run):
                    member.put_back()
                else:
                    run.say("left out of the router: the host does not verify")
                    run.report.notes.append("left out of the router")
        finally:
            member.close()


def _verifies(run: HostRun) -> bool:
    """After a failed deploy (undone, or cut before it changed anything): does what runs verify?"""
    try:
        res = run.call(protocol.Releases())
        current = next((r for r in res.releases if r["current"]), None)
        wanted = [protocol.fields_of(protocol.ServiceCheck, c, "verify") for c in current["verify"]] \
            if current else None
        verify_mod.verify(run, wanted)
        return True
    except Exception as e:  # noqa: BLE001 (whatever it was, the host is not known to serve)
        run.say(f"not verified: {e}")
        return False
