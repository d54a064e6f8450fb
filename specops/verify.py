"""Verify (DESIGN §7): on the host, wait for ready, then compare what runs with what was intended."""
from __future__ import annotations

from .errors import SpecopsError
from .run import HostRun
from .spec import DEFAULT_VENV, bind_address, expectations, port


def service_request(host, svc: dict) -> dict:
    """What verify checks for one service, from the inventory.  No secret: the agent reads the
    API key from the service's env file on the host."""
    from roles.sglang_service import sources
    intended, accepted = expectations(svc, f"{host.name}: service {svc['name']}")
    v = svc.get("verify") or {}
    return {"name": svc["name"], "port": port(svc), "host": bind_address(svc),
            "served_model_name": svc.get("served_model_name"),
            "intended": intended, "accepted": accepted, "timeout": v.get("timeout", 600),
            "prompt": v.get("prompt", "The capital of France is"),
            "min_accept_length": v.get("min_accept_length"), "baseline_tok_s": v.get("baseline_tok_s"),
            "managed": sources(svc, host.get("venv", DEFAULT_VENV))}


def requests(run: HostRun) -> list[dict]:
    reqs = [service_request(run.host, s) for s in run.host.get("services") or []]
    if run.facts:  # paths the probe already resolved need no interpreter on the host again
        files = run.facts.data["files"]
        for r in reqs:
            r["managed"] = [files[k]["path"] if files.get(k, {}).get("path") else k for k in r["managed"]]
    return reqs


def verify(run: HostRun, services: list[dict] | None = None, unlock: bool = False) -> None:
    """Verify services (the inventory's, by default); raise SpecopsError naming each failure.
    With unlock, the same round trip gives the host lock back when verify ends."""
    services = requests(run) if services is None else services
    if not services:
        return
    req = {"mode": "verify", "services": services}
    if unlock and run.lock_token:
        req["unlock"], run.lock_token = run.lock_token, None
    name = run.host.name
    res = run.connect().agent(req, on_stderr=lambda line: run.out.line(name, f"{'verify':<15}{line}"))
    run.report.extra["verify"] = res["services"]
    failed = []
    for s in res["services"]:
        say = lambda text, s=s: run.out.line(name, f"{'verify':<15} {s['name']}: {text}")  # noqa: E731
        for check in s["checks"]:
            say(check)
        gen = s.get("generate")
        if gen:
            say(f"/generate {gen['completion_tokens']} tokens at {gen['tok_s']} tok/s, spec_verify_ct "
                f"{gen['spec_verify_ct']}, spec_accept_length {gen['spec_accept_length']}")
        for note in s["notes"]:
            say(note)
        for f in s["failures"]:
            say(f"FAILED {f}")
        if s.get("journal"):
            say("journal tail:")
            for line in s["journal"].splitlines():
                run.out.line(name, f"{'':<15}   | {line}")
        if s["failures"]:
            failed.append(f"{s['name']}: {'; '.join(s['failures'])}")
        else:
            run.report.notes.append(f"{s['name']} verified")
    if failed:
        raise SpecopsError("verify failed: " + " | ".join(failed))
