"""Run roles on hosts: plan against one probe, apply in one batch, run handlers, report.
The converge steps are specops/converging.py's, the host lock specops/hostlock.py's.

A role is a module with NAME and ``ops(host) -> list[Op]``, built from inventory
vars alone, so every host's ops exist (and bad input is refused) before any
connection is made.  A role that sets REPROBE = True changes what later roles
see (installing packages moves files), so its batch is applied and the host is
probed again before the next role is planned.
"""
from __future__ import annotations

import threading
import time
import traceback
import sys
import os
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable

from . import again, protocol
from .converging import Converging
from .errors import NotStarted, SpecopsError
from .hostlock import HostLock
from .layout import APPLY_JOURNAL
from .inventory import Host
from .ops import Facts, Op, merge_wants
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
    provenance: protocol.Provenance | None = None  # who runs it and from what (a task that records releases)


class Ranks:
    """What this run's verifies found of the ranks of services that span hosts, shared by the hosts'
    threads: a rank > 0 found down is posted by its host's verify, and rank 0's verify, which waits
    for every rank, fails at once naming it (flows/verify.py; its HostRun holds `ranks` and `rounds`) instead of
    waiting its whole timeout.
    """

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


class HostRun(Converging):
    """Everything one host's run needs; the unit of parallelism."""

    def __init__(self, host: Host, roles: list, opts: Options, out: Reporter, ranks=None):
        """`ranks`: what the run's verifies find of the ranks of services that span hosts, shared by
        every host's run (Ranks, above)."""
        self.host, self.roles, self.opts, self.out = host, roles, opts, out
        self.ranks = ranks
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
        self.lock = HostLock(self)
        self.applied: list = []             # writes, removals and enables done (converging.UNDOABLE), for undo
        self.acted = False                  # any action done (a build, a fetch, a restart)
        self.before_change: Callable[[], None] | None = None  # run once, before the first change (rolling)
        self.quick: set[str] = set()  # services whose stop need not drain (out of their routers, --no-drain)
        # Requests that go with the run's last call, in its round trip (the textfile after a deploy)
        self.epilogue: list = []

    def hint(self, task: str, *words: str) -> str:
        """A command a message suggests for this host, as the user would type it (again.command)."""
        return again.command(task, *words, host=self.host.name)

    def connect(self) -> Remote:
        if self.remote is None:
            self.remote = Remote(self.host.name, self.host.vars, self.opts.accept_new)
        return self.remote

    def call(self, request, on_stderr: Callable[[str], None] | None = None, last: bool = False):
        """One request to the agent, run only while this run holds the host lock (if it took it);
        with last=True the same round trip gives the lock back."""
        if not isinstance(request, protocol.Unlock):  # what an interrupted run was doing
            self.report.doing = type(request).__name__
        envelope = self.lock.envelope(last)
        then, self.epilogue = (self.epilogue, []) if last and not self.lock.keeping() else ([], self.epilogue)
        try:  # the lease keeper renews until the last call has returned, however long it takes
            return self.connect().agent(request, **envelope, on_stderr=on_stderr, then=then)
        finally:
            self.lock.sent_last(last)
            for req, res in zip(then, self.remote.followed if then and self.remote else []):
                self.said_after(req, res)

    def flush_epilogue(self) -> None:
        """What no last call carried (a run that held no lock, or made no last call): on its own."""
        if self.epilogue and self.remote and self.remote.session:
            then, self.epilogue = self.epilogue, []
            for req in then:
                try:
                    self.said_after(req, self.remote.agent(req))
                except SpecopsError as e:
                    self.said_after(req, e)

    def said_after(self, request, result) -> None:
        """What an epilogue request did, in a line (a failure there fails nothing: it is said)."""
        if isinstance(result, Exception):
            self.say(f"WARNING: {type(request).__name__}: {result}")
        elif isinstance(request, protocol.Textfile):
            self.report.extra["textfile"] = protocol.to_dict(result)
            self.say(f"textfile: {result.series} series in {result.path}" if result.path else
                     f"textfile: no {request.directory} (node exporter not installed): not written")

    def say(self, text: str) -> None:
        self.report.said(text)
        self.out.line(self.host.name, text)

    def probe(self, ops: list[Op], extra: protocol.Probe | None = None, lock: bool = False) -> Facts:
        """One round trip for every fact the ops need; with lock=True it also takes the host lock."""
        wants = merge_wants([op.wants() for op in ops] + ([extra] if extra else []))
        wants.allow_shared_dirs = self.host.get("allow_shared_dirs") or []
        if lock:
            self.lock.ask(wants)
            self.report.doing = "Probe"
        try:
            self.facts = Facts.of(self.connect().agent(wants) if lock else self.call(wants))
        except NotStarted:
            if lock:
                self.lock.not_asked()
            raise
        if lock:
            self.lock.answered(self.facts.data["lock"])
        cut = self.facts.data.get("interrupted")
        if cut:
            self.say(cut_off_words(cut))
            self.report.notes.append("an earlier run's switch was cut off" + ("; undone" if cut.get("undone") else ""))
            if (cut.get("undone") or {}).get("error"):  # nothing else runs on a half-done switch
                raise SpecopsError(f"an earlier run's switch is half-done and could not be undone: "
                                   f"{cut['undone']['error']}; put that right (its journal: {APPLY_JOURNAL}), "
                                   f"then run again")
        return self.facts


def cut_off_words(cut: dict) -> str:
    """What the probe found of a switch an earlier run was cut off in, and whether this run
    undid it (only a run that takes the host lock does, before anything else)."""
    begun = f"cut off at: {cut['cut_at']}; " if cut.get("cut_at") else ""
    head = (f"WARNING: an earlier run (task {cut.get('task', '?')}) was cut off in the middle of its switch: "
            f"done: {', '.join(cut.get('done') or []) or 'nothing'}; {begun}"
            f"not done: {', '.join(cut.get('not_done') or []) or 'nothing'}")
    undone = cut.get("undone")
    if undone is None:
        return head + "; the next run that takes the lock (a deploy, rollback, stop...) undoes it first"
    if undone.get("error") or undone.get("note"):
        return head + f"; {undone.get('note') or 'its undo failed: ' + undone['error']}"
    return (head + f"; undone before this run: {len(undone['restored'])} file(s) put back"
            + (f", restarted {', '.join(undone['restarted'])}" if undone["restarted"] else "")
            + "".join(f"; WARNING: {w}" for w in undone.get("warnings") or []))


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
            run.lock.release()  # every exit path gives the lock back
            run.flush_epilogue()
    except SpecopsError as e:
        run.report.error = run.out.redact(str(e))
        run.say(f"FAILED: {run.report.error}")
    except Exception as e:  # a bug or an unexpected transport error: fail this host only
        last = traceback.extract_tb(e.__traceback__)[-1:]
        at = f" (at {os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
        run.report.error = run.out.redact(f"{type(e).__name__}: {e}{at}")
        run.say(f"FAILED: {run.report.error}")
        if os.environ.get("SPECOPS_TRACEBACK"):  # for a bug report: where it happened
            sys.stderr.write(run.out.redact(traceback.format_exc()))
    finally:
        if run.remote:
            run.report.round_trips = run.remote.round_trips
            run.remote.close()
        run.report.elapsed = time.monotonic() - t0
    return run.report


def _applied(run: HostRun) -> list[str]:
    return list(run.previous())


def _interrupted(runs: list[HostRun]) -> None:
    """Ctrl-C: end the remote work (closing a connection ends its agent), then give locks back."""
    for run in runs:
        if run.remote:
            run.remote.close()
    for run in runs:
        run.lock.release_interrupted()


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
    def in_pool(batch: list[HostRun]) -> list[HostReport]:
        # Waited on in short steps: a Ctrl-C the kernel gives another thread (a host's, paramiko's)
        # runs its handler here only when this thread next runs Python, never inside a long wait.
        futures = [pool.submit(one, r) for r in batch]
        while not wait(futures, timeout=0.2).done.issuperset(futures):
            pass
        return [f.result() for f in futures]
    # One host runs in this thread, where Ctrl-C lands, so its body can handle it itself.
    run_batch = (lambda b: [_one(r, body) for r in b]) if len(runs) == 1 else in_pool
    if len(runs) > 1:  # hosts in threads of the pool, told of a Ctrl-C through ctypes: imported before one comes
        import ctypes
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
