"""Run roles on hosts: plan against one probe, apply in one batch, run handlers, report.

A role is a module with NAME and ``ops(host) -> list[Op]``, built from inventory
vars alone, so every host's ops exist (and bad input is refused) before any
connection is made.  A role that sets REPROBE = True changes what later roles
see (installing packages moves files), so its batch is applied and the host is
probed again before the next role is planned.
"""
from __future__ import annotations

import ctypes
import getpass
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from .ops import handlers
from .remote import peercopy
from . import protocol, services
from .errors import NotStarted, SpecopsError
from .inventory import Host
from .layout import LOCK_LEASE, new_stamp, release_dir
from .ops import Context, Facts, Op, merge_wants
from .output.report import HostReport, Redactor, Reporter, interrupted, recap  # noqa: F401  (the engine's public face)
from .remote.ssh import Remote


@dataclass
class Options:
    check: bool = False
    diff: bool = False
    accept_new: bool = False
    forks: int = 10
    verbose: bool = True
    serial: int = 0          # hosts per rolling batch; 0: all at once
    max_fail: float = 100.0  # percent of a batch that may fail before later batches are skipped
    break_lock: bool = False
    task: str = "run"
    run_checks: bool = True  # check mode runs the read-only checks (status does not)
    verify_weights: bool = False  # hash every weight file, not only compare sizes and mtimes


class Ranks:
    """What this run's verifies found of the ranks of services that span hosts, shared by the hosts'
    threads: a rank > 0 found down is posted by its host's verify, and rank 0's verify, which waits
    for every rank, fails at once naming it (flows/verify.py) instead of waiting its whole timeout."""

    def __init__(self):
        self._down: dict[tuple[str, str], tuple[str, int]] = {}
        self._lock = threading.Lock()

    def post(self, service: str, node: str, down: str | None, round_: int) -> None:
        """`down`: the state of the node's unit, which is not running and not about to; None: it
        serves, or is being verified again.  `round_`: which verify of the service on its host
        this is (1: the deploy's, 2: its rollback's, ...)."""
        with self._lock:
            if down:
                self._down[(service, node)] = (down, round_)
            else:
                self._down.pop((service, node), None)

    def down(self, service: str, nodes: list[str], round_: int) -> dict[str, str]:
        """The nodes found down by their verify of the same round: what the deploy's verify found
        is not what the rollback's finds.  (A node whose rounds went otherwise is waited for.)"""
        with self._lock:
            return {n: self._down[(service, n)][0] for n in nodes
                    if (service, n) in self._down and self._down[(service, n)][1] == round_}


class HostRun:
    """Everything one host's run needs; the unit of parallelism."""

    def __init__(self, host: Host, roles: list, opts: Options, out: Reporter, ranks: Ranks | None = None):
        self.host, self.roles, self.opts, self.out = host, roles, opts, out
        self.ranks = ranks or Ranks()
        self.rounds: dict[str, int] = {}  # service → how many times this run has verified it here (Ranks)
        self.report = HostReport(host.name)
        self.plan: list[tuple[Any, list[Op]]] = []
        for role in roles:
            ops = role.ops(host)
            for op in ops:
                op.role = role.NAME
            self.plan.append((role, ops))
        self.remote: Remote | None = None
        self.facts: Facts | None = None
        self.lock_token: str | None = None  # set while this run holds the host's lock
        self.last_call = time.monotonic()
        self.applied: list = []             # writes and removals done, for undo
        self.acted = False                  # any action done (a build, a fetch, a restart)
        self.before_change: Callable[[], None] | None = None  # run once, before the first change (rolling)
        self.keep_lock = False  # a "last" call keeps the lock: the body gives it back later (rolling)
        self.quick: set[str] = set()  # services whose stop need not drain (out of their routers, --no-drain)

    def connect(self) -> Remote:
        if self.remote is None:
            self.remote = Remote(self.host.name, self.host.vars, self.opts.accept_new)
        return self.remote

    def call(self, request, on_stderr: Callable[[str], None] | None = None, last: bool = False):
        """One request to the agent, run only while this run holds the host lock (if it took it);
        with last=True the same round trip gives the lock back."""
        held = self.lock_token
        last = last and not self.keep_lock
        if not isinstance(request, protocol.Unlock):  # what an interrupted run was doing
            self.report.doing = type(request).__name__
        self.last_call = time.monotonic()
        try:  # the lease keeper renews until the last call has returned, however long it takes
            return self.connect().agent(request, unlock=held if last else None, lock=held, on_stderr=on_stderr)
        finally:
            if last:
                self.lock_token = None

    def say(self, text: str) -> None:
        self.report.said(text)
        self.out.line(self.host.name, text)

    def probe(self, ops: list[Op], extra: protocol.Probe | None = None, lock: bool = False) -> Facts:
        """One round trip for every fact the ops need; with lock=True it also takes the host lock."""
        wants = merge_wants([op.wants() for op in ops] + ([extra] if extra else []))
        wants.allow_shared_dirs = self.host.get("allow_shared_dirs") or []
        if lock:
            wants.lock_acquire, wants.break_lock = holder(self.opts.task), self.opts.break_lock
            self.report.doing = "Probe"
            # Known before the probe answers, so a probe that fails after taking the lock gives it back.
            self.lock_token = wants.lock_acquire.token
        try:
            self.facts = Facts.of(self.connect().agent(wants) if lock else self.call(wants))
        except NotStarted:
            if lock:  # this request, which would have taken the lock, never reached the host
                self.lock_token = None
            raise
        if lock:
            got = self.facts.data["lock"]
            if not got["acquired"]:
                self.lock_token = None
                h = got["holder"]
                if got.get("running"):
                    raise SpecopsError(f"{self.host.name}: commands an earlier run started are still running there "
                                       f"({pids(got['running'])}); the host lock waits for them to end "
                                       f"(--break-lock goes ahead anyway)")
                raise SpecopsError(f"{self.host.name}: locked by {h.get('who', '?')} (pid {h.get('pid', '?')}, "
                                   f"task {h.get('task', '?')}, since {h.get('since', '?')}); "
                                   f"wait for it, or use --break-lock if it is gone")
            self.lock_token = got["token"]
            if got.get("took_over"):
                t = got["took_over"]
                self.say(f"took over the lock of {t.get('who')} (pid {t.get('pid')}, task {t.get('task')}): "
                         f"{t['reason']}")
            if got.get("still_running"):
                self.say(f"WARNING: --break-lock: commands an earlier run started still run there "
                         f"({pids(got['still_running'])})")
            LeaseKeeper(self).start()
        cut = self.facts.data.get("interrupted")
        if cut:
            self.say(f"WARNING: an earlier run (task {cut.get('task', '?')}) was cut off in the middle of its "
                     f"changes: done: {', '.join(cut['done']) or 'nothing'}; not done: "
                     f"{', '.join(cut['not_done']) or 'nothing'}")
            self.report.notes.append("an earlier run was cut off mid-apply")
        return self.facts

    def unlock(self) -> None:
        if self.lock_token and not self.keep_lock:
            res = self.call(protocol.Unlock(token=self.lock_token), last=True)
            if res.running:
                self.say(f"lock kept: commands of this run still run there ({pids(res.running)}); the next run "
                         f"waits for them")

    def push(self, uploads: list[tuple]) -> None:
        """Send files the batch needs, with progress (bytes, rate, ETA); an upload is (local, remote)
        or (local, remote, offset) to resume a cut one."""
        for local, remote, *rest in uploads:
            name, t0, last, offset = remote.rsplit("/", 1)[-1], time.monotonic(), [0.0], (rest or [0])[0]

            def progress(sent, total, name=name, t0=t0, last=last, offset=offset):
                now = time.monotonic()
                if now - last[0] >= 2 or sent == total:
                    last[0] = now
                    rate = (sent - offset) / max(now - t0, 1e-3)
                    self.say(f"push {name}: {sent / 2**20:.1f}/{total / 2**20:.1f} MiB, {rate / 2**20:.1f} MiB/s, "
                             f"ETA {(total - sent) / rate if rate else 0:.0f}s")

            self.report.extra["bytes_pushed"] = (self.report.extra.get("bytes_pushed", 0)
                                                 + self.connect().push(local, remote, progress, offset))

    def apply(self, actions: list) -> None:
        if not actions:
            return
        if self.before_change:  # e.g. take this worker out of its router and let it drain
            hook, self.before_change = self.before_change, None
            hook()
        res = self.call(protocol.Apply(actions=actions, allow_shared_dirs=self.host.get("allow_shared_dirs") or []),
                        on_stderr=lambda line: self.say(line.strip()))
        done = {r["index"] for r in res.results}
        self.acted = self.acted or bool(done)
        self.applied += [a for i, a in enumerate(actions)
                         if i in done and isinstance(a, (protocol.Write, protocol.Remove))]
        if not res.ok:
            raise SpecopsError(f"{res.error} (action {res.failed + 1} of {len(actions)}; "
                               f"{len(res.results)} applied before it)")

    def run_checks(self, checks: list, after: str | None) -> None:
        """Check mode: the read-only checks run for real, unless an earlier role's changes
        (`after`) would change what they check."""
        if not checks:
            return
        if after:
            for c in checks:
                self.say(f"{'check':<15} {c.desc}: would run after {after} changes the host")
            return
        res = self.call(protocol.Check(actions=checks))
        for r in res.results:
            self.say(f"{'check':<15} {checks[r['index']].desc}: passed")
        if not res.ok:
            raise SpecopsError(f"check failed: {res.error}")

    def previous(self) -> dict[str, str]:
        """What this run replaced: path → "backup" | "absent" (for undo and the release)."""
        return {a.path: ("backup" if a.backup else "absent") for a in self.applied}

    def converge(self, ctx: Context | None = None, facts: Facts | None = None) -> Context:
        """Plan every role against the facts and apply: the body of deploy."""
        ctx = ctx or Context(self.host.name, self.opts.check, verify_weights=self.opts.verify_weights)
        if not ctx.check and ctx.release_dir is None:
            ctx.release_dir = release_dir(new_stamp())  # where replaced files are backed up
        remaining = [op for _, ops in self.plan for op in ops]
        facts = facts or self.probe(remaining, lock=not ctx.check)
        pending, checks, changed_by = [], [], None
        self.report.extra.setdefault("bytes_pushed", 0)
        for role, ops in self.plan:
            role_actions, moved = [], False
            for op in ops:
                c = op.plan(facts, ctx)
                self.report.changes.append(c.record(self.host.name))
                self.out.change(self.host.name, c, ctx.check)
                role_actions += c.actions
                checks += c.checks
                ctx.notified += [n for n in c.notify if n not in ctx.notified]
                moved = moved or c.moves
                if not ctx.check:
                    self.push(c.uploads)
                    for copy in c.copies:
                        res = peercopy.copy(self, copy)
                        self.report.extra["bytes_copied"] = self.report.extra.get("bytes_copied", 0) + res.received
                        ctx.reserved[copy.device] = ctx.reserved.get(copy.device, 0) + res.received
            pending += role_actions
            remaining = remaining[len(ops):]
            if getattr(role, "REPROBE", False) and (role_actions or moved) and remaining:
                if ctx.check:
                    changed_by = changed_by or role.NAME
                    continue
                self.apply(checks + pending)
                pending, checks = [], []
                facts = self.probe(remaining)
        todo = handlers.actions(ctx.notified, services.unit_refs(self.host, self.quick))
        for h in handlers.ordered(ctx.notified):
            self.say(f"{'handler':<15} {h}: " + ("would run" if ctx.check else "run"))
        if ctx.check:
            if self.opts.run_checks:
                self.run_checks(checks, changed_by)
        else:
            self.apply(checks + pending + todo)
        return ctx


class LeaseKeeper(threading.Thread):
    """Renews the host lock's lease while this run holds it and makes no requests (a long verify,
    a GPU window's job), over a channel of its own."""

    def __init__(self, run: HostRun):
        super().__init__(daemon=True, name=f"lease-{run.host.name}")
        self.run_ = run

    def run(self) -> None:
        every = lease() / 3
        while self.run_.lock_token:
            time.sleep(min(5.0, every))
            token = self.run_.lock_token
            if token and time.monotonic() - self.run_.last_call >= every:
                try:
                    self.run_.remote.agent_once(protocol.Renew(token=token))
                    self.run_.last_call = time.monotonic()
                except Exception:  # the run's own next request says what is wrong
                    pass


def holder(task: str) -> protocol.Holder:
    """Who holds a host's lock: shown to anyone refused by it."""
    return protocol.Holder(who=f"{getpass.getuser()}@{socket.gethostname()}", pid=os.getpid(), task=task,
                           since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), token=uuid.uuid4().hex,
                           lease=lease())


def pids(running: list[int]) -> str:
    return ", ".join(f"pid {p}" if p else "pid not shown" for p in running)


def lease() -> float:
    """How long a host lock stays held without a request of its run (SPECOPS_LOCK_LEASE seconds)."""
    return float(os.environ.get("SPECOPS_LOCK_LEASE") or LOCK_LEASE)


def _one(run: HostRun, body: Callable[[HostRun], Any]) -> HostReport:
    t0 = time.monotonic()
    run.report.started = True
    try:
        try:
            run.report.result = body(run)
        except KeyboardInterrupt:
            run.report.cut_short(_applied(run))
            if run.remote:  # closing the session ends the agent on the host first
                run.remote.close()
            raise
        finally:
            if run.lock_token:  # every exit path gives the lock back
                run.unlock()
    except SpecopsError as e:
        run.report.error = run.out.redact(str(e))
        run.say(f"FAILED: {run.report.error}")
    except Exception as e:  # a bug or an unexpected transport error: fail this host only
        run.report.error = run.out.redact(f"{type(e).__name__}: {e}")
        run.say(f"FAILED: {run.report.error}")
    finally:
        if run.remote:
            run.report.round_trips = run.remote.round_trips
            run.remote.close()
        run.report.elapsed = time.monotonic() - t0
    return run.report


def _applied(run: HostRun) -> list[str]:
    return [a.path for a in run.applied]


def _interrupted(runs: list[HostRun]) -> None:
    """Ctrl-C: end the remote work (closing a connection ends its agent), then give locks back."""
    for run in runs:
        if run.remote:
            run.remote.close()
    for run in runs:
        if run.lock_token:
            token, run.lock_token = run.lock_token, None
            try:
                fresh = Remote(run.host.name, run.host.vars, run.opts.accept_new)
                res = fresh.agent(protocol.Unlock(token=token))
                fresh.close()
                run.say("interrupted: lock released" if res.released else
                        f"interrupted: lock kept: commands of this run still run there ({pids(res.running)})"
                        if res.running else "interrupted: the lock was no longer this run's")
            except Exception as e:  # the host may be what hung; say so and go on
                run.say(f"interrupted: could not release the lock: {e}")


def run_hosts(hosts: list[Host], body: Callable[[HostRun], Any], roles: list,
              opts: Options, out: Reporter) -> list[HostReport]:
    """Build every host's plan (refusing bad input before any connection), then run: in
    parallel, or in rolling batches of opts.serial that stop when a batch fails too much."""
    ranks = Ranks()
    runs = [HostRun(h, roles, opts, out, ranks) for h in hosts]
    size = opts.serial or len(runs)
    batches = [runs[i:i + size] for i in range(0, len(runs), size)]
    pool, busy = ThreadPoolExecutor(max(1, min(opts.forks, size))), {}

    def one(run: HostRun) -> HostReport:
        busy[run] = threading.get_ident()
        try:
            return _one(run, body)
        finally:
            busy.pop(run, None)
    # One host runs in this thread, where Ctrl-C lands, so its body can handle it itself.
    run_batch = (lambda b: [_one(r, body) for r in b]) if len(runs) == 1 else (lambda b: list(pool.map(one, b)))
    try:
        for n, batch in enumerate(batches):
            reports = run_batch(batch)
            failed = sum(1 for r in reports if r.error)
            if failed and failed * 100 / len(batch) > opts.max_fail and n + 1 < len(batches):
                for run in (r for b in batches[n + 1:] for r in b):
                    run.report.error = f"skipped: batch {n + 1} had {failed} of {len(batch)} hosts fail " \
                                       f"(--max-fail {opts.max_fail:g}%)"
                    run.report.notes.append("skipped")
                break
    except KeyboardInterrupt:
        for run in runs:  # where each host was when the Ctrl-C came, before it reacts
            if run.report.started and run in busy:
                run.report.cut_short(_applied(run))
        # Each host's body gets the Ctrl-C too, as a lone host's does: what it was in the middle of
        # ends, its own `finally` restores what it took down (a baseline, a GPU window) and gives
        # the lock back.  A second Ctrl-C stops waiting for that.
        for ident in list(busy.values()):
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))
        if busy:
            out.line("-", f"interrupted: {len(busy)} host(s) finishing what they must restore (Ctrl-C again "
                          "gives their locks back without waiting)")
        try:
            try:
                pool.shutdown(wait=True, cancel_futures=True)
            finally:
                _interrupted(runs)
        finally:  # even a second Ctrl-C ends with every host's report, for the recap and --json
            raise interrupted([r.report for r in runs])  # noqa: B012
    pool.shutdown()
    return [r.report for r in runs]
