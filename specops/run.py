"""Run roles on hosts: plan against one probe, apply in one batch, run handlers, report.

A role is a module with NAME and ``ops(host) -> list[Op]``, built from inventory
vars alone, so every host's ops exist (and bad input is refused) before any
connection is made.  A role that sets REPROBE = True changes what later roles
see (installing packages moves files), so its batch is applied and the host is
probed again before the next role is planned.
"""
from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import SpecopsError
from .inventory import Host
from .ops import Change, Context, Facts, Op, handler_actions, merge_wants
from .releases import new_stamp, release_dir
from .ssh import Remote


class Redactor:
    """Replaces every secret value from the inventory wherever text leaves specops."""

    def __init__(self, hosts: list[Host]):
        secrets = set()
        for h in hosts:
            for svc in h.get("services") or []:
                secrets.update(v for v in (svc.get("env_secret") or {}).values() if v)
                if svc.get("api_key"):
                    secrets.add(svc["api_key"])
        self.secrets = sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, "***")
        return text


class Reporter:
    """Thread-safe, redacted output: a line per change, diffs on request, a recap."""

    def __init__(self, redact: Redactor, show_diff: bool, stream=None, verbose: bool = True):
        self.redact, self.show_diff, self.verbose = redact, show_diff, verbose
        self.stream = stream or sys.stdout
        self.lock = threading.Lock()

    def line(self, host: str, text: str) -> None:
        with self.lock:
            self.stream.write(self.redact(f"{host:<12} {text}") + "\n")
            self.stream.flush()

    def change(self, host: str, c: Change, check: bool) -> None:
        if not c.changed and not c.warning and not self.verbose:
            return
        state = ("would change" if check else "changed") if c.changed else "ok"
        detail = c.summary if c.changed or c.actions else ""
        self.line(host, f"{c.role:<15} {c.target}: {state}" + (f" ({detail})" if detail else "")
                  + (f" WARNING: {c.warning}" if c.warning else ""))
        if c.changed and c.diff and self.show_diff:
            with self.lock:
                self.stream.write(self.redact(c.diff if c.diff.endswith("\n") else c.diff + "\n"))


@dataclass
class HostReport:
    name: str
    changes: list[dict] = field(default_factory=list)
    error: str | None = None
    round_trips: int = 0
    elapsed: float = 0.0
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def changed(self) -> int:
        return sum(1 for c in self.changes if c["changed"])

    @property
    def ok(self) -> int:
        return sum(1 for c in self.changes if not c["changed"])

    @property
    def status(self) -> str:
        return "failed" if self.error else ("changed" if self.changed else "ok")


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


class HostRun:
    """Everything one host's run needs; the unit of parallelism."""

    def __init__(self, host: Host, roles: list, opts: Options, out: Reporter):
        self.host, self.roles, self.opts, self.out = host, roles, opts, out
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
        self.applied: list[dict] = []       # writes and removals done, for undo

    def connect(self) -> Remote:
        if self.remote is None:
            self.remote = Remote(self.host.name, self.host.vars, self.opts.accept_new)
            self.remote.open()
        return self.remote

    def probe(self, ops: list[Op], extra: dict | None = None, lock: bool = False) -> Facts:
        """One round trip for every fact the ops need; with lock=True it also takes the host lock."""
        wants = merge_wants([op.wants() for op in ops] + [extra or {}])
        if lock:
            wants["lock_acquire"] = {"holder": holder(self.opts.task), "break": self.opts.break_lock}
        self.facts = Facts(self.connect().agent({"mode": "probe", **wants}))
        if lock:
            got = self.facts.data["lock"]
            if not got["acquired"]:
                h = got["holder"]
                raise SpecopsError(f"{self.host.name}: locked by {h.get('who', '?')} (pid {h.get('pid', '?')}, "
                                   f"task {h.get('task', '?')}, since {h.get('since', '?')}); "
                                   f"wait for it, or use --break-lock if it is gone")
            self.lock_token = got["token"]
        return self.facts

    def unlock(self) -> None:
        if self.lock_token:
            token, self.lock_token = self.lock_token, None
            self.connect().agent({"mode": "unlock", "token": token})

    def push(self, uploads: list[tuple[str, str]]) -> None:
        """Send files the batch needs, with progress: name, bytes sent, elapsed time."""
        for local, remote in uploads:
            name, t0, last = remote.rsplit("/", 1)[-1], time.monotonic(), [0.0]

            def progress(sent, total, name=name, t0=t0, last=last):
                now = time.monotonic()
                if now - last[0] >= 2 or sent == total:
                    last[0] = now
                    self.out.line(self.host.name, f"push {name}: {sent / 2**20:.1f}/{total / 2**20:.1f} MiB "
                                                  f"{now - t0:.1f}s")

            self.report.extra["bytes_pushed"] = (self.report.extra.get("bytes_pushed", 0)
                                                 + self.connect().push(local, remote, progress))

    def apply(self, actions: list[dict]) -> None:
        if not actions:
            return
        res = self.connect().agent({"mode": "apply", "actions": actions},
                                   on_stderr=lambda line: self.out.line(self.host.name, line.strip()))
        done = {r["index"] for r in res["results"]}
        self.applied += [a for i, a in enumerate(actions) if i in done and a["kind"] in ("write", "remove")]
        if not res["ok"]:
            done = len(res["results"])
            raise SpecopsError(f"{res['error']} (action {res['failed'] + 1} of {len(actions)}; "
                               f"{done} applied before it)")

    def converge(self, ctx: Context | None = None, facts: Facts | None = None) -> Context:
        """Plan every role against the facts and apply: the body of deploy."""
        ctx = ctx or Context(self.host.name, self.opts.check)
        if not ctx.check and ctx.release_dir is None:
            ctx.release_dir = release_dir(new_stamp())  # where replaced files are backed up
        remaining = [op for _, ops in self.plan for op in ops]
        facts = facts or self.probe(remaining, lock=not ctx.check)
        pending: list[dict] = []
        self.report.extra.setdefault("bytes_pushed", 0)
        for role, ops in self.plan:
            role_actions = []
            for op in ops:
                c = op.plan(facts, ctx)
                self.report.changes.append(c.record(self.host.name))
                self.out.change(self.host.name, c, ctx.check)
                role_actions += c.actions
                ctx.notified += [n for n in c.notify if n not in ctx.notified]
                if c.uploads and not ctx.check:
                    self.push(c.uploads)
            pending += role_actions
            remaining = remaining[len(ops):]
            if getattr(role, "REPROBE", False) and role_actions and not ctx.check and remaining:
                self.apply(pending)
                pending = []
                facts = self.probe(remaining)
        handlers = handler_actions(ctx.notified)
        for h in handlers:
            self.out.line(self.host.name, f"{'handler':<15} {h['desc'][9:]}: " +
                          ("would run" if ctx.check else "run"))
        if not ctx.check:
            self.apply(pending + handlers)
        return ctx


def holder(task: str) -> dict:
    """Who holds a host's lock: shown to anyone refused by it."""
    return {"who": f"{getpass.getuser()}@{socket.gethostname()}", "pid": os.getpid(), "task": task,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "token": uuid.uuid4().hex}


def _one(run: HostRun, body: Callable[[HostRun], None]) -> HostReport:
    t0 = time.monotonic()
    try:
        try:
            body(run)
        except KeyboardInterrupt:
            if run.remote:  # closing the session ends the agent on the host first
                run.remote.close()
            raise
        finally:
            if run.lock_token:  # every exit path gives the lock back
                run.unlock()
    except SpecopsError as e:
        run.report.error = run.out.redact(str(e))
        run.out.line(run.host.name, f"FAILED: {run.report.error}")
    except Exception as e:  # a bug or an unexpected transport error: fail this host only
        run.report.error = run.out.redact(f"{type(e).__name__}: {e}")
        run.out.line(run.host.name, f"FAILED: {run.report.error}")
    finally:
        if run.remote:
            run.report.round_trips = run.remote.round_trips
            run.remote.close()
        run.report.elapsed = time.monotonic() - t0
    return run.report


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
                fresh.agent({"mode": "unlock", "token": token})
                fresh.close()
                run.out.line(run.host.name, "interrupted: lock released")
            except Exception as e:  # the host may be what hung; say so and go on
                run.out.line(run.host.name, f"interrupted: could not release the lock: {e}")


def run_hosts(hosts: list[Host], body: Callable[[HostRun], None], roles: list,
              opts: Options, out: Reporter) -> list[HostReport]:
    """Build every host's plan (refusing bad input before any connection), then run: in
    parallel, or in rolling batches of opts.serial that stop when a batch fails too much."""
    runs = [HostRun(h, roles, opts, out) for h in hosts]
    size = opts.serial or len(runs)
    batches = [runs[i:i + size] for i in range(0, len(runs), size)]
    pool = ThreadPoolExecutor(max(1, min(opts.forks, size)))
    # One host runs in this thread, where Ctrl-C lands, so its body can handle it itself.
    run_batch = (lambda b: [_one(r, body) for r in b]) if len(runs) == 1 else \
        (lambda b: list(pool.map(lambda r: _one(r, body), b)))
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
        pool.shutdown(wait=False, cancel_futures=True)
        _interrupted(runs)
        raise
    pool.shutdown()
    return [r.report for r in runs]


def recap(reports: list[HostReport], out: Reporter, json_path: str | None = None,
          extra: dict | None = None) -> int:
    out.stream.write("\nRECAP\n")
    for r in reports:
        line = f"{r.name:<12} ok={r.ok:<3} changed={r.changed:<3} failed={1 if r.error else 0}"
        line += f"  {r.elapsed:.1f}s"
        if r.notes:
            line += "  " + "; ".join(r.notes)
        out.stream.write(out.redact(line) + "\n")
    failed = [r.name for r in reports if r.error]
    if failed:
        out.stream.write(f"failed hosts: {', '.join(failed)}\n")
    out.stream.flush()
    if json_path:
        doc = {"hosts": {r.name: {"status": r.status, "ok": r.ok, "changed": r.changed,
                                  "error": r.error, "round_trips": r.round_trips,
                                  "elapsed": round(r.elapsed, 3), "notes": r.notes,
                                  "changes": r.changes, **r.extra} for r in reports},
               **(extra or {})}
        with open(json_path, "w") as f:
            f.write(out.redact(json.dumps(doc, indent=2)) + "\n")
    return 1 if failed else 0
