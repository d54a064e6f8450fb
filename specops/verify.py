"""Verify (DESIGN §7): on the host, wait for ready, then compare what runs with what was intended."""
from __future__ import annotations

from .errors import SpecopsError
from .run import HostRun
from .spec import DEFAULT_VENV, bind_address, expectations, port


def service_request(host, svc: dict, managed: list[str]) -> dict:
    intended, accepted = expectations(svc, f"{host.name}: service {svc['name']}")
    v = svc.get("verify") or {}
    return {"name": svc["name"], "port": port(svc), "host": bind_address(svc),
            "api_key": svc.get("api_key"), "served_model_name": svc.get("served_model_name"),
            "intended": intended, "accepted": accepted, "timeout": v.get("timeout", 600),
            "prompt": v.get("prompt", "The capital of France is"),
            "min_accept_length": v.get("min_accept_length"), "baseline_tok_s": v.get("baseline_tok_s"),
            "managed": managed}


def managed_paths(host, svc: dict) -> list[str]:
    from roles.sglang_service import sources
    return sources(svc, host.get("venv", DEFAULT_VENV))


def verify(run: HostRun) -> None:
    """Verify every service on the host; raise SpecopsError naming each failure."""
    services = run.host.get("services") or []
    if not services:
        return
    req = {"mode": "verify", "services": [service_request(run.host, s, managed_paths(run.host, s)) for s in services]}
    name = run.host.name
    res = run.connect().agent(req, on_stderr=lambda line: run.out.line(name, f"{'verify':<15}{line}"))
    run.report.extra["verify"] = res["services"]
    failed = []
    for s in res["services"]:
        for check in s["checks"]:
            run.out.line(name, f"{'verify':<15} {s['name']}: {check}")
        gen = s.get("generate")
        if gen:
            run.out.line(name, f"{'verify':<15} {s['name']}: /generate {gen['completion_tokens']} tokens at "
                               f"{gen['tok_s']} tok/s, spec_verify_ct {gen['spec_verify_ct']}, "
                               f"spec_accept_length {gen['spec_accept_length']}")
        for note in s["notes"]:
            run.out.line(name, f"{'verify':<15} {s['name']}: {note}")
        for f in s["failures"]:
            run.out.line(name, f"{'verify':<15} {s['name']}: FAILED {f}")
        if s.get("journal"):
            run.out.line(name, f"{'verify':<15} {s['name']}: journal tail:")
            for line in s["journal"].splitlines():
                run.out.line(name, f"{'':<15}   | {line}")
        if s["failures"]:
            failed.append(f"{s['name']}: {'; '.join(s['failures'])}")
        else:
            run.report.notes.append(f"{s['name']} verified")
    if failed:
        raise SpecopsError("verify failed: " + " | ".join(failed))
