"""status: per service, drift (what deploy would change), state, uptime, staleness, GPU memory."""
from __future__ import annotations

import time

from . import verify as verify_mod
from .facts import base_wants
from .run import HostRun

STALE = "running code of "


def collect(run: HostRun) -> dict:
    """Plan in check mode (drift = what deploy would change) against one probe, then summarise."""
    assert run.opts.check, "status never changes a host"
    ops = [op for _, role_ops in run.plan for op in role_ops]
    ctx = run.converge(facts=run.probe(ops, base_wants(run.host)))
    facts = run.facts
    drift = [c for c in run.report.changes if c["changed"]]
    services = []
    for svc in run.host.get("services") or []:
        u = facts.unit(svc["name"])
        started = u.get("ExecMainStartTimestamp")
        mine = [c for c in drift if svc["name"] in c["target"] or c["role"] in ("model_patches", "draft_config")]
        services.append({
            "service": svc["name"], "state": f"{u.get('ActiveState', '?')}/{u.get('SubState', '?')}",
            "uptime_s": round(facts.data["time"] - started) if started and u.get("ActiveState") == "active" else None,
            "drift": [f"{c['target']}: {c['summary']}" for c in mine if not c["target"].startswith(STALE)],
            "stale": [c["summary"] for c in mine if c["target"].startswith(STALE)],
        })
    peeked = {p["name"]: p for p in run.connect().agent(
        {"mode": "peek", "services": [r for r in verify_mod.requests(run)
                                      if facts.unit(r["name"]).get("ActiveState") == "active"]})["services"]}
    for s in services:
        p = peeked.get(s["service"])
        s["effective"] = p.get("effective") if p else None
        s["spec_mismatch"] = (p["failures"] if p else []) + [n for n in (p["notes"] if p else [])]
    gpus = facts.gpu.get("gpus") or []
    summary = {"services": services, "gpu": [f"{g['index']}:{g['memory.used']}/{g['memory.total']}MiB" for g in gpus]
               if facts.gpu.get("present") else "no nvidia-smi", "restart_pending": ctx.notified}
    run.report.extra["status"] = summary
    return summary


def table(results: dict[str, dict]) -> str:
    rows = [("HOST", "SERVICE", "STATE", "UPTIME", "SPEC steps/topk/draft", "DRIFT", "GPU MEMORY")]
    for host, res in results.items():
        for s in res["services"] or [{"service": "-", "state": "-", "uptime_s": None, "drift": [], "stale": []}]:
            eff = s.get("effective") or {}
            spec = "/".join(str(eff.get(f"speculative_{k}", "-")) for k in ("num_steps", "eagle_topk",
                                                                            "num_draft_tokens"))
            drift = "; ".join(s["drift"] + [f"STALE: {x}" for x in s["stale"]]
                              + [f"SPEC: {x}" for x in s.get("spec_mismatch", [])]) or "none"
            up = time.strftime("%Hh%Mm", time.gmtime(s["uptime_s"])) if s["uptime_s"] is not None else "-"
            gpu = res["gpu"] if isinstance(res["gpu"], str) else " ".join(res["gpu"])
            rows.append((host, s["service"], s["state"], up, spec, drift, gpu))
    widths = [max(len(str(r[i])) for r in rows) for i in range(6)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r[:6], widths)) + "  " + r[6] for r in rows)
