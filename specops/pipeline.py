"""What the tasks do to one host, step by step.  Each function is the body of a task."""
from __future__ import annotations

from . import verify as verify_mod
from .errors import SpecopsError
from .run import HostRun
from .spec import DEFAULT_VENV, intended


def deploy(run: HostRun) -> None:
    """lock → facts → plan → apply → handlers → verify → record the release.
    A failed verify (or apply) undoes this deploy's changes and verifies the previous state."""
    ctx = run.converge()
    if run.opts.check:
        return
    try:
        verify_mod.verify(run, unlock=not run.applied)
    except SpecopsError as failure:
        if run.applied:
            undo(run, ctx.release_dir, failure)
        raise
    if run.applied:
        record(run, ctx.release_dir)


def undo(run: HostRun, directory: str, failure: Exception) -> None:
    """Put back what this deploy replaced, restart, verify the previous release, then fail."""
    stamp = directory.rsplit("/", 1)[1]
    previous = {a["path"]: ("backup" if a.get("backup") else "absent") for a in run.applied}
    services = [s["name"] for s in run.host.get("services") or []]
    run.out.line(run.host.name, f"ROLLING BACK: {failure}")
    res = run.connect().agent({"mode": "undo", "stamp": stamp, "previous": previous, "services": services})
    run.connect().agent({"mode": "release_record", "stamp": stamp, "status": "rolled-back",
                         "managed": [], "previous": previous,
                         "manifest": {"services": services, "summary": f"verify failed: {failure}"[:300]}})
    run.applied = []
    run.report.notes.append("rolled back")
    back_to = res.get("current") or "the state before this deploy"
    try:
        verify_mod.verify(run, res["verify"])  # none when this was the first deploy
    except SpecopsError as e:
        raise SpecopsError(f"{failure}; rolled back to {back_to}, which also fails: {e}") from None
    raise SpecopsError(f"{failure}; rolled back to {back_to}, verified") from None


def record(run: HostRun, directory: str) -> None:
    """Snapshot what is now deployed into the release, with what it replaced; move current."""
    host = run.host
    venv = host.get("venv", DEFAULT_VENV)
    services = host.get("services") or []
    from roles.sglang_service import sources
    managed = sorted({key for s in services for key in sources(s, venv)})
    packages = (run.facts.venv(venv).get("packages") if run.facts else {}) or {}
    req = {"mode": "release_record", "stamp": directory.rsplit("/", 1)[1], "managed": managed,
           "previous": {a["path"]: ("backup" if a.get("backup") else "absent") for a in run.applied},
           "manifest": {"services": [s["name"] for s in services],
                        "spec": {s["name"]: intended(s) for s in services},
                        "verify": verify_mod.requests(run), "packages": packages,
                        "summary": ", ".join(c["target"] for c in run.report.changes if c["changed"])[:300]}}
    if run.lock_token:  # the same round trip gives the lock back
        req["unlock"], run.lock_token = run.lock_token, None
    res = run.connect().agent(req)
    run.report.notes.append(f"release {res['stamp']}")


def rollback(run: HostRun, to: str | None = None) -> None:
    """Restore the release before current (or --to), purge bytecode, reload, restart, verify."""
    run.probe([], lock=True)
    res = run.connect().agent({"mode": "rollback", "to": to})
    if res.get("ok") is False:
        raise SpecopsError(f"{run.host.name}: {res['error']}")
    run.out.line(run.host.name, f"rolled back {res['from']} → {res['to']}: restored "
                                f"{len(res['restored'])} file(s)")
    for path in res["restored"]:
        run.out.line(run.host.name, f"  restored {path}")
    run.report.notes.append(f"now on {res['to']}")
    verify_mod.verify(run, res["verify"], unlock=True)


def releases(run: HostRun) -> dict:
    return run.connect().agent({"mode": "releases"})


def stop(run: HostRun, services: list[str] | None = None) -> dict:
    """Stop services and prove their GPU memory is free, killing leftovers that hold it."""
    wanted = [s for s in run.host.get("services") or [] if not services or s["name"] in services]
    req = {"mode": "stop", "services": [{"name": s["name"], "port": s.get("port", 30000),
                                         "grace": s.get("stop_grace", 10)} for s in wanted]}
    res = run.connect().agent(req, on_stderr=lambda line: run.out.line(run.host.name, line.strip()))
    failures = []
    for s in res["services"]:
        for k in s["killed"]:
            run.out.line(run.host.name, f"{s['name']}: killed leftover pid {k['pid']} ({k['cmd']}) with "
                                        f"{k.get('signal', 'SIGTERM')}")
        freed = ", ".join(f"GPU {i}: {mib} MiB" for i, mib in sorted(s["freed_mib"].items())) or "none held"
        run.out.line(run.host.name, f"{s['name']}: stopped in {s['seconds']}s; freed {freed}; "
                                    f"{s['apps_after']} compute app(s) left on the GPUs")
        failures += [f"{s['name']}: {f}" for f in s["failures"]]
    run.report.extra["stop"] = res
    if failures:
        raise SpecopsError("; ".join(failures))
    return res


def start_and_verify(run: HostRun, services: list[str]) -> None:
    """Start services again and verify them as deployed: the current release, or the inventory
    on a host specops has not deployed yet."""
    res = run.connect().agent({"mode": "start", "services": services})
    deployed = res["verify"] if res["verify"] is not None else verify_mod.requests(run)
    verify_mod.verify(run, [r for r in deployed if r["name"] in services])


def gpu_window(run: HostRun, command: str, services: list[str] | None = None) -> int:
    """Stop the services, prove the GPUs free, run the job, then always restart and verify."""
    run.probe([], lock=True)
    names = [s["name"] for s in run.host.get("services") or [] if not services or s["name"] in services]
    status = 1
    try:
        stop(run, names)
        run.out.line(run.host.name, f"GPU free; running: {command}")
        remote = run.connect()
        status = remote.stream(command, lambda text: run.out.line(run.host.name, f"| {text}"))
        if remote.interrupted:
            run.out.line(run.host.name, "interrupted: Ctrl-C was passed to the job")
        run.out.line(run.host.name, f"job exited with status {status}")
        run.report.extra["job_status"] = status
    finally:
        run.out.line(run.host.name, f"restarting {', '.join(names)}")
        start_and_verify(run, names)
    return status


def bootstrap(run: HostRun) -> None:
    """A bare Debian/Ubuntu box: python3 first (the agent needs it), then deploy."""
    res = run.connect().exec("command -v python3 >/dev/null || { apt-get update -qq && "
                             "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv; }",
                             on_stderr=lambda line: run.out.line(run.host.name, line))
    if res.rc != 0:
        raise SpecopsError(f"{run.host.name}: could not install python3: {res.stderr.strip()[-300:]}")
    deploy(run)
