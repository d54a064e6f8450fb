"""status: per service, drift (what deploy would change), state, uptime, staleness, effective
arguments; per host, GPU memory and who holds it."""
from __future__ import annotations

import time

from .. import again, kinds, protocol
from . import verify as verify_mod
from .facts import base_wants
from ..run import HostRun
from ..kinds import router as router_kind
from ..sglang import stack


def _gpu(facts, active: set[str]) -> tuple[list[str], list[str]]:
    """(per-GPU memory lines, warnings about memory held by no running service)."""
    gpu = facts.gpu
    if not gpu.get("present"):
        return ["no nvidia-smi"], []
    if gpu.get("error"):
        return [f"nvidia-smi failed: {gpu['error']}"], []

    def mib(v):
        return "?" if v is None else str(v)
    lines = [f"{g['index']}:{mib(g['memory.used'])}/{mib(g['memory.total'])}MiB" for g in gpu.get("gpus", [])]
    warnings = [f"nvidia-smi does not report {u}" for u in gpu.get("unknown", [])]
    for app in gpu.get("apps", []):
        if app.get("unit") in active and not app.get("earlier"):
            continue
        if app.get("earlier"):
            whose = f"left over from an earlier run of {app['unit']}"
        elif app.get("unit"):
            whose = f"of {app['unit']}, which is not running"
        else:
            whose = "that belongs to no running service"
        warnings.append(f"GPU {app.get('gpu', '?')}: {mib(app.get('mib'))} MiB held by pid {app['pid']} "
                        f"({app.get('title') or '?'}, user {app.get('user', '?')}) {whose}")
    return lines, warnings


def collect(run: HostRun) -> dict:
    """Plan in check mode (drift = what deploy would change) against one probe, then summarise."""
    assert run.opts.check, "status never changes a host"
    ops = [op for _, role_ops in run.plan for op in role_ops]
    ctx = run.converge(facts=run.probe(ops, base_wants(run.host)))
    facts = run.facts
    drift = [c for c in run.report.changes if c["changed"]]
    cut = facts.data.get("interrupted")  # a switch an earlier run was cut off in: every service's concern
    half = [f"HALF-DONE SWITCH of a {cut.get('task', '?')} (cut off at: {cut.get('cut_at') or 'its start'}): the "
            f"next run that takes the lock undoes it"] if cut else []
    rows = []
    for _, svc in kinds.of_host(run.host):
        name = svc["name"]
        u = facts.unit(name)
        started = u.get("ExecMainStartTimestamp")
        mine = [c for c in drift if name in c["services"]]
        rows.append({
            "service": name, "state": f"{u.get('ActiveState', '?')}/{u.get('SubState', '?')}",
            "node": f"rank {svc['node_rank']} of {svc['nnodes']}" if svc.get("nnodes") else None,
            # systemd's count since the last start asked for: each one is an exit nobody asked for
            "restarts": int(u.get("NRestarts") or 0),
            "uptime_s": round(facts.data["time"] - started) if started and u.get("ActiveState") == "active" else None,
            "drift": half + [f"{c['target']}: {c['summary']}" for c in mine if not c["stale"]],
            "stale": [c["summary"] for c in mine if c["stale"]],
        })
    active = {r["service"] for r in rows if r["state"].startswith("active")}
    peeked = {p.name: p for p in run.call(protocol.Peek(services=[
        c for c in verify_mod.checks(run) if c.name in active and c.http])).services}
    by_name = {s["name"]: (k, s) for k, s in kinds.of_host(run.host)}
    for r in rows:
        p = peeked.get(r["service"])
        r["effective"] = p.effective if p else None
        r["spec_mismatch"] = (p.failures + p.notes) if p else []
        kind, svc = by_name[r["service"]]
        if kind.name == "router":
            r["not_serving"] = p.not_serving if p else None  # every request it gets fails meanwhile
            if p and p.members is None:  # the router did not say: not a statement about its workers
                r["workers"] = [{"worker": "?", "url": "-", "in_router": None, "healthy": None, "load": None,
                                 "problem": "; ".join(p.failures) or "no answer"}]
                continue
            have = (p.members if p else None) or {}
            r["workers"] = [
                {
                    "worker": f"{w.host}/{w.service}",
                    "url": w.url,
                    "in_router": w.url in have,
                    "healthy": (have.get(w.url) or {}).get("is_healthy"),
                    "load": (have.get(w.url) or {}).get("load"),
                }
                for w in router_kind.workers_of(run.host, svc)
            ]
    gpu, warnings = _gpu(facts, active)
    kept = run.call(protocol.Releases())
    for r in rows:
        kind, svc = by_name[r["service"]]
        if kind.name != "sglang":  # a router runs from its own venv, which no release records
            continue
        p = peeked.get(r["service"])
        r["runs"] = runs(facts.unit(r["service"]).get("text"), kept, r["service"], p, kinds.venv_of(run.host))
        if p and p.running:
            r["production"] = production(run.host, svc, p.running, kept, r["runs"], r.get("uptime_s"))
    summary = {
        "services": rows,
        "gpu": gpu,
        "gpu_warnings": warnings,
        "restart_pending": [str(h) for h in ctx.notified],
        "venv": kinds.venv_of(run.host),
        "current": kept.current,
        "stacks": [{k: s[k] for k in ("path", "bytes", "new", "releases")} for s in kept.stacks],
        "uv_cache": kept.uv_cache,
    }
    run.report.extra["status"] = summary
    return summary


VERDICTS = {"not_paying": "DRAFT NOT PAYING", "degraded": "DRAFT DEGRADED"}  # production's keys, as said


def runs(unit_text: str | None, kept: protocol.ReleasesResult, name: str, peeked, inventory_venv: str) -> dict:
    """The stack, SGLang version and release the unit actually runs (its unit file's ExecStart; the
    newest release that deployed that unit file), and the stack the inventory asks for."""
    venv = stack.venv_in_unit(unit_text)
    current = next((r for r in kept.releases if r["stamp"] == kept.current), None)
    mine = [r for r in kept.releases if r.get("status") == "deployed" and name in (r.get("services") or [])]
    release = current if current and current.get("venv") in (venv, None) else \
        next((r for r in reversed(mine) if r.get("venv") == venv), None)
    version = (peeked.running or {}).get("version") if peeked else None
    return {"venv": venv, "release": release["stamp"] if release else None,
            "sglang": version or ((release or {}).get("packages") or {}).get("sglang"),
            "inventory_venv": inventory_venv}


def production(host, svc: dict, running: dict, kept: protocol.ReleasesResult, ran: dict, uptime_s) -> dict:
    """Its /metrics against what its release measured: the figures and, with traffic to judge
    (payoff.enough_traffic: its watch's verify calls a second, over the `uptime_s` it has served),
    payoff.py's verdict in words: not paying (where the release measured a speedup, the estimate
    under 1 + its watch's margin), else degraded (under its watch's fraction of the accept length)."""
    from ..fleetwide.payoff import enough_traffic, estimate, payoff, remedy, watch_of
    out = {k: running.get(k) for k in ("accept_length", "gen_throughput", "queue", "running", "verify_calls",
                                       "generation_tokens", "error")}
    rel = next((r for r in kept.releases if r["stamp"] == ran["release"]), None) or {}
    figure = protocol.release_figure((rel.get("perf") or {}).get(svc["name"]), (rel.get("tune") or {}).get(svc["name"]),
                                     (rel.get("spec") or {}).get(svc["name"]) or {})
    out["deployed_accept_length"], out["deployed_speedup"], out["deployed_source"] = figure or (None, None, None)
    now, then, speedup = out.get("accept_length"), out["deployed_accept_length"], out["deployed_speedup"] or None
    w = watch_of(host, svc)
    # SGLang's gauge is its last decode-log window's (0 before the first)
    calls, seconds = out.get("verify_calls") or 0, uptime_s or 0
    out["judged"] = bool(now) and seconds > 0 and enough_traffic(w, calls / seconds)
    if not (out["judged"] and then):
        return out
    not_paying, degraded = payoff(w, now, then, speedup)
    measured = f"accept length {then:.1f} when deployed at {rel['stamp']} ({out['deployed_source']})"
    tune = f"run {remedy(host.name)}"
    if not_paying:
        out["not_paying"] = (f"estimated speedup {estimate(now, then, speedup):.2f}× (accept length {now:.1f} in "
                             f"production; {speedup:.2f}× at {measured}), under {1 + w.speedup_margin:g}: below 1 "
                             f"speculative decoding costs more than it gives; {tune}")
    elif degraded:
        out["degraded"] = (f"accept length {now:.1f} in production, under {w.accept_fraction:g} × {measured}: the "
                           f"draft fits this traffic less well, and may still pay; {tune}")
    return out


def table(results: dict[str, dict]) -> str:
    rows = [("HOST", "SERVICE", "STATE", "UPTIME", "SPEC steps/topk/draft", "DRIFT", "GPU MEMORY")]
    for host, res in results.items():
        for s in res["services"] or [{"service": "-", "state": "-", "uptime_s": None, "drift": [], "stale": []}]:
            eff = s.get("effective") or {}
            spec = "/".join(str(eff.get(f"speculative_{k}", "-")) for k in ("num_steps", "eagle_topk",
                                                                            "num_draft_tokens"))
            crashed = [f"CRASHED: systemd restarted it {s['restarts']} time(s) since its start (journalctl -u "
                       f"{s['service']})"] if s.get("restarts") else []
            drift = "; ".join(crashed + s["drift"] + [f"STALE: {x}" for x in s["stale"]]
                              + [f"SPEC: {x}" for x in s.get("spec_mismatch", [])]) or "none"
            up = time.strftime("%Hh%Mm", time.gmtime(s["uptime_s"])) if s["uptime_s"] is not None else "-"
            name = f"{s['service']} ({s['node']})" if s.get("node") else s["service"]
            rows.append((host, name, s["state"], up, spec, drift, " ".join(res["gpu"])))
    widths = [max(len(str(r[i])) for r in rows) for i in range(6)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r[:6], widths)) + "  " + r[6] for r in rows]
    for host, res in results.items():
        for s in res["services"]:
            if s.get("not_serving"):
                lines.append(f"{host}: router {s['service']}: NOT SERVING: {s['not_serving']}")
            lines += [f"{host}: router {s['service']}: " + (
                f"its workers are unknown: {w['problem']}" if w.get("problem") else
                f"{w['worker']} ({w['url']}): " + ("in the router, " + ("healthy" if w["healthy"] else "NOT healthy")
                                                  + f", load {w['load']}" if w["in_router"] else "NOT in the router"))
                for w in s.get("workers") or []]
        for s in res["services"]:
            lines += _runs_lines(host, s)
        if res.get("stacks"):
            lines.append(f"{host}: current release {res.get('current') or 'none'}; "
                         f"{len(res['stacks'])} stack(s) kept: {sum(s['new'] for s in res['stacks']) / 2**30:.2f} GiB, "
                         f"uv's cache {res.get('uv_cache', 0) / 2**30:.2f} GiB more")
        lines += [f"{host}: WARNING: {w}" for w in res.get("gpu_warnings", [])]
    return "\n".join(lines)


def _runs_lines(host: str, s: dict) -> list[str]:
    """What the unit runs, as status says it; its production figures, and a draft that no longer
    pays or pays less."""
    ran, out = s.get("runs") or {}, []
    if ran.get("venv"):
        line = (f"{host}: {s['service']} runs sglang {ran.get('sglang') or '?'} from stack {ran['venv']} "
                f"(release {ran.get('release') or 'none'})")
        if ran["venv"] != ran.get("inventory_venv"):
            line += (f"; the inventory asks for stack {ran['inventory_venv']}: to run it, "
                     + again.command("deploy", host=host))
        out.append(line)
    p = s.get("production")
    if p and p.get("error"):
        out.append(f"{host}: {s['service']}: /metrics: {p['error']}")
    elif p and p.get("accept_length") is not None:
        deployed = (f", {p['deployed_accept_length']:.2f} measured by {p['deployed_source']}"
                    if p.get("deployed_accept_length") else "")
        accept = (f"accept length {p['accept_length']:.2f}{deployed}" if p.get("judged")
                  else "too little traffic yet to judge its accept length")
        out.append(f"{host}: {s['service']} in production: {accept}; "
                   f"{p.get('gen_throughput') or 0:.1f} tok/s; {int(p.get('running') or 0)} running, "
                   f"{int(p.get('queue') or 0)} queued; {int(p.get('verify_calls') or 0)} verify calls since start")
    out += [f"{host}: {s['service']}: {said}: {p[key]}" for key, said in VERDICTS.items() if p and p.get(key)]
    return out


def needs_doing(results: dict[str, dict]) -> bool:
    """What --strict fails on: anything status shows that a run (or a person) must act on."""
    return any(s.get("drift") or s.get("stale") or s.get("restarts") or s.get("spec_mismatch")
               or s.get("not_serving") or any((s.get("production") or {}).get(key) for key in VERDICTS)
               or (s.get("runs") or {}).get("venv") not in (None, (s.get("runs") or {}).get("inventory_venv"))
               for res in results.values() for s in res["services"])
