"""A worker behind SGLang's router is out of it whenever it stops: deploys (without dropping a
request) and every other planned stop (stop, gpu-window, rollback, spec-bench's baseline).

Around one host's deploy, for each router of the inventory that routes to its services:
before the first change reaches the host, take its workers out of the router and wait until
each has no request in flight; after the deploy verified (or, when it failed, after the host is
back on a release that verifies), put them back and wait until the router says they are
healthy.  A host whose deploy changes nothing is never taken out; one that does not verify is
left out, and says so.  With `--serial N`, the engine's rolling batches make this a rolling
deploy: the hosts not yet reached keep serving.

Any other planned stop takes the stopped services out first too (`out_of_routers`): a router
that keeps a stopped worker's URL sends users' prompts, with its API key (also its admin key),
to whoever binds that port next.  `inv stop` leaves them out; the others put them back once
what they started again verifies.
"""
from __future__ import annotations

from .. import kinds, protocol
from . import verify as verify_mod
from ..errors import SpecopsError
from ..run import HostRun
from ..kinds.router import Worker, routers_of
from ..remote.ssh import Remote

DRAIN_TIMEOUT = 120  # seconds a worker may take to finish what it was serving (a service's drain_timeout)


class Membership:
    """This host's workers in the routers that route to it, and the connections to those routers."""

    def __init__(self, run: HostRun, names: list[str] | None = None):
        """`names`: only these services of the host (default: all of them)."""
        self.run = run
        inv = run.host.inventory
        routes = routers_of(inv, run.host.name) if inv else []
        self.routes = [(h, s, mine) for h, s, ws in routes
                       if (mine := [w for w in ws if names is None or w.service in names])]
        self.out: list[tuple[object, protocol.ServiceCheck, Worker]] = []
        self.remotes: dict[str, Remote] = {}

    def _call(self, router_host, request):
        remote = self.remotes.get(router_host.name)
        if remote is None:
            remote = self.remotes[router_host.name] = Remote(
                router_host.name, router_host.vars, self.run.opts.accept_new
            )
        return remote.agent(request, on_stderr=lambda line: self.run.say(line.strip()))

    def take_out(self) -> None:
        """Out of every router, then idle (or a failure: what was taken out goes back)."""
        for router_host, svc, workers in self.routes:
            check = kinds.kind_of(svc).check(router_host, svc)
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
        checks = {c.name: c for c in kinds.checks(self.run.host)}
        timeouts = {s["name"]: s.get("drain_timeout", DRAIN_TIMEOUT) for _, s in kinds.of_host(self.run.host)}
        for name in dict.fromkeys(w.service for _, _, w in self.out):
            res = self.run.call(protocol.WorkerIdle(service=checks[name], timeout=timeouts[name]),
                                on_stderr=lambda line: self.run.say(line.strip()))
            if not res.idle:
                raise SpecopsError(f"{name} still has {res.running} running and {res.waiting} waiting request(s) "
                                   f"after {res.waited:.0f} s out of the router; not stopped")
            self.run.quick.add(name)  # out and idle: its server need not drain when it stops

    def put_back(self) -> None:
        for router_host, check, w in self.out:
            self.run.quick.discard(w.service)
            res = self._call(router_host, protocol.RouterAdd(router=check, url=w.url))
            self.run.say(f"{w.service} is back in router {router_host.name}/{check.name}, healthy" if not res.absent
                         else f"router {router_host.name}/{check.name} is not running: {w.service} not put back")
        self.out = []

    def close(self) -> None:
        for remote in self.remotes.values():
            remote.close()

    def serving(self) -> None:
        """After a roll: each router generates (its circuit breakers may have taken every worker out
        for a while, with /workers still listing them healthy); waited for up to its verify timeout."""
        for router_host, svc, _ in self.routes:
            check = kinds.kind_of(svc).check(router_host, svc)
            where = f"router {router_host.name}/{svc['name']}"
            res = self._call(router_host, protocol.RouterMembers(router=check, serving_within=check.timeout))
            if res.absent:
                self.run.say(f"{where} is not running")
            elif res.not_serving:
                raise SpecopsError(f"{where} is not serving {res.waited:.0f} s after the roll: {res.not_serving}")
            elif res.waited >= 1:
                self.run.say(f"{where} was not serving after the roll; it serves again after {res.waited:.0f} s")
                self.run.report.notes.append(f"{where} not serving for {res.waited:.0f} s")
            else:
                self.run.say(f"{where} serves: a generation through it answered 200")

    def settle(self, ok: bool, back: bool = True) -> None:
        """After the body: back in the routers if what runs verifies (`ok`: the body verified it);
        out, and said, if it does not or if the body left it stopped (`back` False)."""
        if not self.out:
            return
        if not back:
            names = ", ".join(dict.fromkeys(w.service for _, _, w in self.out))
            self.run.say(f"{names}: left out of the router while stopped (a deploy puts it back)")
            self.run.report.notes.append("left out of the router (stopped)")
        elif ok or _verifies(self.run):
            self.put_back()
        else:
            self.run.say("left out of the router: the host does not verify")
            self.run.report.notes.append("left out of the router")


def deploy(run: HostRun, body, drain: bool = True) -> None:
    """`body(run)` (pipeline.deploy) with this host's workers out of their routers while it changes,
    then, if it changed anything, a generation through each of those routers.  Without `drain`,
    they stay in, and their servers stop without draining: requests fail either way."""
    if not drain:
        run.quick.update(s["name"] for _, s in kinds.of_host(run.host))
    member = Membership(run)
    if not member.routes:
        return body(run)
    if drain:
        run.before_change = member.take_out
    ok = False
    try:
        try:
            with run.lock.kept():  # until the worker is back: another run must not drain it meanwhile
                body(run)
            ok = True
        finally:
            run.before_change = None
            member.settle(ok)
        if not run.opts.check and any(c["changed"] for c in run.report.changes):
            member.serving()
    finally:
        member.close()


def out_of_routers(run: HostRun, body, names: list[str] | None = None, back: bool = True):
    """`body()`, which stops the services `names` (default: all the host's), with them out of
    their routers (and idle) first.  `back`: the body starts them again, and they go back once
    they verify; otherwise (inv stop) they stay out.  Returns what `body` returns.  A service in
    run.quick is left to whoever put it there: a deploy that took it out (and puts it back), or one
    with --no-drain (which leaves it in)."""
    names = [s["name"] for _, s in kinds.of_host(run.host) if (names is None or s["name"] in names)
             and s["name"] not in run.quick]
    member = Membership(run, names)
    if not member.routes:
        return body()
    ok = started = False
    try:
        with run.lock.kept():  # until they are back (a deploy's --bench nests this)
            member.take_out()
            started = True
            result = body()
        ok = True
        return result
    finally:
        try:
            member.settle(ok, back or not started)  # never stopped: still serving, back it goes
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
