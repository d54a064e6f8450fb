"""Run roles on hosts: plan against one probe, apply in one batch, run handlers, report.

A role is a module with NAME and ``ops(host) -> list[Op]``, built from inventory
vars alone, so every host's ops exist (and bad input is refused) before any
connection is made.  A role that sets REPROBE = True changes what later roles
see (installing packages moves files), so its batch is applied and the host is
probed again before the next role is planned.
"""
from __future__ import annotations

import json
import sys
import threading
import time
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


# A step after apply (verify, for one): (host, remote, facts, report, options) → None, raising on failure.
Step = Callable[[Host, Remote, Facts, HostReport, "HostRun"], None]


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

    def connect(self) -> Remote:
        if self.remote is None:
            self.remote = Remote(self.host.name, self.host.vars, self.opts.accept_new)
            self.remote.open()
        return self.remote

    def probe(self, ops: list[Op], extra: dict | None = None) -> Facts:
        wants = merge_wants([op.wants() for op in ops] + [extra or {}])
        self.facts = Facts(self.connect().agent({"mode": "probe", **wants}))
        return self.facts

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
        facts = facts or self.probe(remaining)
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


def run_hosts(hosts: list[Host], body: Callable[[HostRun], None], roles: list,
              opts: Options, out: Reporter) -> list[HostReport]:
    """Build every host's plan (refusing bad input before any connection), then run in parallel."""
    runs = [HostRun(h, roles, opts, out) for h in hosts]

    def one(run: HostRun) -> HostReport:
        t0 = time.monotonic()
        try:
            body(run)
        except SpecopsError as e:
            run.report.error = out.redact(str(e))
            out.line(run.host.name, f"FAILED: {run.report.error}")
        except Exception as e:  # a bug or an unexpected transport error: fail this host only
            run.report.error = out.redact(f"{type(e).__name__}: {e}")
            out.line(run.host.name, f"FAILED: {run.report.error}")
        finally:
            if run.remote:
                run.report.round_trips = run.remote.round_trips
                run.remote.close()
            run.report.elapsed = time.monotonic() - t0
        return run.report

    with ThreadPoolExecutor(max(1, min(opts.forks, len(runs)))) as pool:
        return list(pool.map(one, runs))


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
