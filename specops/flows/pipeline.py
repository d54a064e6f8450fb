"""What the tasks do to one host, step by step.  Each function is the body of a task and
returns what the task shows; failures raise SpecopsError."""
from __future__ import annotations

import os

from .. import kinds, protocol
from . import rolling, textfile
from . import verify as verify_mod
from ..errors import ApplyFailed, GateFailed, SpecopsError, UsageError
from ..layout import WINDOW_PREFIX
from ..output.report import ROLLED_BACK, shorten
from ..run import HostRun


def deploy(run: HostRun, bench=None) -> None:
    """A deploy's phases, top to bottom.  A failure before the switch leaves what serves as it
    was; one in the switch, verify or a gate undoes the deploy and verifies the previous release
    (`failed`)."""
    textfile.after(run)
    ctx = run.context = run.new_context()  # the release this attempt would become
    perf, batch = [], None
    try:
        facts = run.lock_and_probe(ctx)  # 1. lock; probe (a switch cut off earlier is undone first)
        batch = run.plan_batch(ctx, facts)  # 2. plan, on the controller (pushes what the batch needs)
        if run.opts.check:
            return run.check_batch(batch)
        run.apply_batch(batch)  # 3. on the host: check → prepare → switch → handlers (agent/converge/stage.py)
        verify_mod.verify(run, last=not (run.applied or run.acted) and not bench)  # 4. verify (else a record follows)
        perf = bench(run) if bench else []  # 5. the gates
    except SpecopsError as failure:
        if run.opts.check:
            raise
        failed(run, ctx.release_dir, failure, planned=batch is not None)  # raises: what was undone, or why not
    if run.applied or run.acted:  # 6. record the release (a restart for new weights is one too)
        record(run, ctx.release_dir, last=not perf)
    for i, result in enumerate(perf):
        run.call(protocol.PerfRecord(perf=result, stamp=ctx.release_dir.rsplit("/", 1)[1] if run.applied else None),
                 last=i == len(perf) - 1)


def failed(run: HostRun, directory: str, failure: SpecopsError, planned: bool = True) -> None:
    """Whatever failed, the host ends on one release: the switch undone, or never begun.
    `planned`: the plan was made (else only a REPROBE role's preparations may have run)."""
    if run.applying:  # the connection went while the host applied: what it did is not known here
        raise SpecopsError(f"{failure}; the batch's outcome on the host is not known: a switch it began is "
                           f"undone by the next run that takes the lock (`{run.hint('status')}` names it)") from None
    if run.applied or (isinstance(failure, ApplyFailed) and failure.phase == protocol.SWITCH):
        undo(run, directory, failure)  # raises: what was undone, and whether that verifies
    left = f"; left in place (not undone): {', '.join(run.kept)}" if run.kept else ""
    if isinstance(failure, ApplyFailed) or (run.kept and not planned):  # before any switch
        if isinstance(failure, ApplyFailed) and failure.phase == protocol.PREPARE:
            attempt(run, directory, failure)  # a refusal (a check, the plan) records nothing
        run.report.notes.append(UNTOUCHED)
        raise SpecopsError(f"{failure}; {UNTOUCHED}{left}") from None
    if not planned:  # refused while planning (a push, a plan): nothing was sent to change the host
        raise failure
    # A deploy that switched nothing has nothing of its own to undo: what failed is what already ran.
    run.report.notes.append("nothing to undo")
    did = f"switched nothing{left}" if run.kept else "changed nothing"
    raise SpecopsError(f"{failure}; nothing to undo: this deploy {did}") from None


UNTOUCHED = "nothing that serves was touched"


def _names(run: HostRun) -> list[str]:
    return [s["name"] for _, s in kinds.of_host(run.host)]


def attempt(run: HostRun, directory: str, failure: Exception, previous: dict | None = None) -> str:
    """Record this attempt as a release that is not current (rolled-back), with why it failed and
    what its preparations left in place; its stamp."""
    stamp = directory.rsplit("/", 1)[1]
    run.call(protocol.ReleaseRecord(stamp=stamp, managed=[], previous=previous or {}, status=protocol.ROLLED_BACK,
                                    manifest={"services": _names(run), "summary": shorten(str(failure), 300),
                                              "kept": list(run.kept)}, provenance=run.opts.provenance))
    return stamp


def undo(run: HostRun, directory: str, failure: Exception) -> None:
    """Put back what this deploy replaced and enabled, restart, verify the previous release, then fail."""
    previous = run.previous()
    run.say(f"ROLLING BACK: {failure}")
    refs = list(kinds.unit_refs(run.host, run.quick).values())
    try:
        res = run.call(protocol.Undo(stamp=directory.rsplit("/", 1)[1], previous=previous, services=refs,
                                     enabled=run.enabled(), running=run.running, restarts=run.restarting,
                                     concerned=sorted(run.concerned),
                                     allow_shared_dirs=run.host.get("allow_shared_dirs") or []),
                       on_stderr=lambda line: run.say(line.strip()))
    except SpecopsError as e:
        then = ("the next run that takes the lock undoes it first (its journal stays)"
                if isinstance(failure, ApplyFailed) and failure.phase == protocol.SWITCH else
                f"the host may be between two releases: `{run.hint('rollback')}` puts the one before back")
        raise SpecopsError(f"{failure}; its undo failed too: {e}; {then}") from None
    stamp = attempt(run, directory, failure, previous)
    run.report.notes.append(ROLLED_BACK)
    for result in failure.measured if isinstance(failure, GateFailed) else []:
        # What the gate measured stays with the release it refused (else the page shows "-" for it).
        run.call(protocol.PerfRecord(perf=result, stamp=stamp))
    run.applied = []
    left = f"; left in place (not undone): {', '.join(run.kept)}" if run.kept else ""
    if res.current is None:  # the first deploy: nothing of specops's ran before it
        raise SpecopsError(f"{failure}; rolled back to the state before this deploy (no earlier release "
                           f"to verify){left}") from None
    ran = [c for c in res.verify or [] if run.running is None or c.name in run.running]
    if not ran:
        raise SpecopsError(f"{failure}; rolled back to {res.current}, whose services were not running before "
                           f"this deploy: left stopped{left}") from None
    try:
        verify_mod.verify(run, ran)
    except SpecopsError as e:
        raise SpecopsError(f"{failure}; rolled back to {res.current}, which also fails: {e}{left}") from None
    raise SpecopsError(f"{failure}; rolled back to {res.current}, verified{left}") from None


def record(run: HostRun, directory: str, last: bool = True) -> None:
    """Snapshot what is now deployed into the release, with what it replaced; move current."""
    served = kinds.of_host(run.host)
    venv = kinds.venv_of(run.host)
    packages = (run.facts.venv(venv).get("packages") if run.facts else {}) or {}
    weights = {}
    for dest in sorted({d for k, s in served for d in k.weights(s)}):
        m = ((run.facts.data.get("weights") or {}).get(dest) or {}).get("manifest") or {} if run.facts else {}
        weights[dest] = {"commit": m.get("commit"), "digest": m.get("digest"), "source": m.get("source")}
    manifest = {"services": _names(run), "spec": {s["name"]: k.intended(s) for k, s in served},
                "venv": venv, "weights": weights,
                "verify": [protocol.encode(c) for c in verify_mod.checks(run)], "packages": packages,
                "verified": [{k: r.get(k) for k in ("name", "checks", "generate", "notes")}
                             for r in run.report.extra.get("verify") or []],
                "watch": {s["name"]: watched(s) for k, s in served if k.name == "sglang"},
                "summary": shorten(", ".join(c["target"] for c in run.report.changes if c["changed"]), 300)}
    res = run.call(protocol.ReleaseRecord(stamp=directory.rsplit("/", 1)[1], managed=kinds.managed_files(run.host),
                                          previous=run.previous(), manifest=manifest,
                                          provenance=run.opts.provenance), last=last)
    run.report.notes.append(f"release {res.stamp}")


def watched(svc: dict) -> dict:
    """What the textfile tells Prometheus of a service beyond its arguments: whether it runs with
    CUDA graphs, and its gate."""
    return {"cuda_graph": "--disable-cuda-graph" not in (svc.get("extra_args") or []),
            "gate_min_accept_length": (svc.get("gate") or {}).get("min_accept_length")}


def rollback(run: HostRun, to: str | None = None) -> None:
    """Restore the release before current (or --to), purge bytecode, reload, restart, verify;
    each worker out of its routers meanwhile."""
    textfile.after(run)
    run.probe([], lock=True)
    rolling.out_of_routers(run, lambda: _rollback(run, to))


def _rollback(run: HostRun, to: str | None) -> None:
    res = run.call(protocol.Rollback(to=to, services=list(kinds.unit_refs(run.host, run.quick).values()),
                                     allow_shared_dirs=run.host.get("allow_shared_dirs") or []),
                   on_stderr=lambda line: run.say(line.strip()))
    run.say(f"rolled back {res.replaced} → {res.to}: restored {len(res.restored)} file(s)")
    for path in res.restored:
        run.say(f"  restored {path}")
    for note in res.notes:
        run.say(note)
        run.report.notes.append(note)
    run.report.notes.append(f"now on {res.to}")
    verify_mod.verify(run, res.verify, last=True)


def releases(run: HostRun) -> protocol.ReleasesResult:
    """The host's releases (also in --json's report, as `releases`)."""
    res = run.call(protocol.Releases())
    run.report.extra["releases"] = protocol.to_dict(res)
    return res


def _selected(run: HostRun, names: list[str] | None) -> list[protocol.UnitRef]:
    refs = kinds.unit_refs(run.host, run.quick)
    unknown = [n for n in names or [] if n not in refs]
    if unknown:
        raise UsageError(f"{run.host.name}: no service {unknown[0]!r} (known: {', '.join(refs) or 'none'})")
    return [ref for name, ref in refs.items() if not names or name in names]


def stop_task(run: HostRun, names: list[str] | None = None, disable: bool = False) -> protocol.StopResult:
    """`inv stop`: out of their routers first, and left out (a deploy puts them back); says what a
    reboot does to each (an enabled unit starts again; --disable keeps it stopped)."""
    run.probe([], lock=True)
    res = rolling.out_of_routers(run, lambda: stop(run, names, disable), names, back=False)
    for s in res.services:
        if s.enabled == "disabled":
            run.say(f"{s.name}: disabled: a reboot leaves it stopped (`{run.hint('deploy')}` enables and starts it)")
        elif s.enabled == "enabled":
            keep = run.hint("stop", "--service", s.name, "--disable")
            run.say(f"{s.name}: still enabled: a reboot starts it again (`{keep}` keeps it stopped)")
    return res


def stop(run: HostRun, names: list[str] | None = None, disable: bool = False) -> protocol.StopResult:
    """Stop services and prove their GPU memory free, killing leftovers of their runs; `disable`:
    disable their units too (a reboot does not start them)."""
    refs = _selected(run, names)
    others = [n for n in kinds.unit_refs(run.host) if n not in {r.name for r in refs}]
    res = run.call(protocol.Stop(services=refs, others=others, disable=disable),
                   on_stderr=lambda line: run.say(line.strip()))
    failures = []
    for s in res.services:
        for k in s.killed:
            run.say(f"{s.name}: killed leftover pid {k.pid} ({k.title}) with {k.signal}")
        freed = ", ".join(f"GPU {i}: {mib} MiB" for i, mib in sorted(s.freed_mib.items())) or "none held"
        run.say(f"{s.name}: stopped in {s.seconds}s; freed {freed}; {len(s.left)} compute app(s) left on the GPUs")
        if s.timed_out is not None:
            run.say(f"{s.name}: did not exit on SIGTERM: systemd killed it at TimeoutStopSec, after {s.timed_out}s "
                    f"(result 'timeout')")
            run.report.notes.append(f"{s.name}: killed at TimeoutStopSec after {s.timed_out}s")
        elif s.left_failed is not None:  # not a clean stop: its run failed as it was stopped
            run.say(f"{s.name}: its run ended with a failure while being stopped (result '{s.left_failed}'): "
                    f"left \"failed\" (journalctl -u {s.name})")
            run.report.notes.append(f"{s.name}: failed while being stopped (result '{s.left_failed}'); "
                                    f"left \"failed\"")
        if s.failed_before is not None:
            run.say(f"{s.name}: was already failed before this stop (result '{s.failed_before}'), not by it: "
                    f"left \"failed\" (journalctl -u {s.name})")
            run.report.notes.append(f"{s.name}: failed before the stop (result '{s.failed_before}'); left \"failed\"")
        for p in s.left:
            run.say(f"{s.name}: left on the GPUs: pid {p.pid} ({p.title}, user {p.user}, "
                    f"{p.mib if p.mib is not None else 'unknown'} MiB)")
        failures += [f"{s.name}: {f}" for f in s.failures]
    run.report.extra["stop"] = protocol.encode(res)
    if failures:
        raise SpecopsError("; ".join(failures))
    return res


def start_and_verify(run: HostRun, names: list[str], deployed: list | None = None) -> None:
    """Start services again and verify them as deployed: `deployed` (a deploy not recorded yet),
    else the current release, or the inventory on a host specops has not deployed yet."""
    res = run.call(protocol.Start(services=_selected(run, names)), on_stderr=lambda line: run.say(line.strip()))
    deployed = deployed or (res.verify if res.verify is not None else verify_mod.checks(run))
    verify_mod.verify(run, [c for c in deployed if c.name in names])


def gpu_window(run: HostRun, command: str, names: list[str] | None = None, as_root: bool = False) -> int:
    """Stop the services, prove the GPUs free, run the job (as the login user, or as root with
    as_root), then always restart and verify.  Returns the job's status.  A worker is out of its
    routers meanwhile, and back once it verifies."""
    run.probe([], lock=True)
    names = [r.name for r in _selected(run, names)]
    return rolling.out_of_routers(run, lambda: _window(run, command, names, as_root), names)


def in_window(run: HostRun, names: list[str], body, deployed: list | None = None):
    """The one GPU window: stop the services (their GPU memory proven free), run `body()`, and
    always start them again and verify them (as `deployed`, else the current release), whatever
    `body` did: a job, a baseline, a tune's candidates."""
    try:
        stop(run, names)
        run.say("GPU free")
        return body()
    finally:
        run.say(f"restarting {', '.join(names)}")
        start_and_verify(run, names, deployed)


def _window(run: HostRun, command: str, names: list[str], as_root: bool) -> int:
    scope = WINDOW_PREFIX + os.urandom(8).hex()

    def job() -> int:
        status = 1
        try:
            run.say(f"running: {command}")
            remote = run.connect()
            status = remote.stream(command, lambda text: run.say(f"| {text}"), root=as_root, scope=scope)
            if remote.interrupted:
                run.say("interrupted: Ctrl-C was passed to the job")
            run.say(f"job exited with status {status}")
            run.report.extra["job_status"] = status
        finally:
            _end_job(run, scope)
        return status
    return in_window(run, names, job)


def _end_job(run: HostRun, scope: str) -> None:
    """What of the job still runs (a child that ignored Ctrl-C and the hang-up) is stopped before
    the services start again: nothing of it keeps the GPUs or outlives the window's lock."""
    res = run.call(protocol.EndJob(scope=scope))
    for p in res.ended:
        run.say(f"the job's pid {p.pid} ({p.title}, user {p.user}) was still running: stopped")
    for p in res.left:
        run.say(f"WARNING: the job's pid {p.pid} ({p.title}) is still running after SIGKILL")


def bootstrap(run: HostRun) -> None:
    """A bare Debian/Ubuntu box: python3 first (the agent needs it), then deploy."""
    res = run.connect().exec("command -v python3 >/dev/null || { apt-get update -qq && "
                             "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv; }",
                             on_stderr=run.say)
    if res.rc != 0:
        raise SpecopsError(f"{run.host.name}: could not install python3: {res.stderr.strip()[-300:]}")
    deploy(run)
