"""`inv deploy --bench`: after verify, each service with a `gate` is measured (spec-bench, with its
baseline when the gate asks for a speedup) and held to it.  A failure is raised like a failed
verify, and undoes the deploy; a pass is said with the figures that passed it.  A selection with
no gate is refused before connecting (it would measure nothing), and a service without one is
said not to be held."""
from __future__ import annotations

import sys

from .. import kinds, protocol
from . import specbench
from . import verify as verify_mod
from ..errors import GateFailed, SpecopsError, UsageError

EXAMPLE = "gate: {min_speedup: 1.1}"  # what a service is told to add


def checks(gate: dict, perf: dict, previous: dict | None) -> list[tuple[bool, str]]:
    """Each rule of a service's gate held against a spec-bench result: (passed, the figures and the
    rule in one phrase).  gate: {min_speedup, at_concurrency, min_accept_length, max_regression_pct},
    each optional; previous: the record of the release this deploy replaces (or keeps)."""
    levels = {lv["concurrency"]: lv["figures"] for lv in perf["spec"]}
    if not levels:
        return [(False, "the bench measured no level")]
    c = gate.get("at_concurrency") or min(levels)
    if c not in levels:
        return [(False, f"the gate is at concurrency {c}, which the bench did not measure")]
    out, where, tok_s = [], f"at concurrency {c}", levels[c]["output_tok_s"]
    if gate.get("min_speedup") is not None:
        gain = (perf.get("speedup") or {}).get(str(c))
        base = {lv["concurrency"]: lv["figures"] for lv in perf.get("baseline") or []}.get(c)
        if gain is None:
            out.append((False, f"min_speedup needs a baseline {where}, and there is none"))
        else:
            ok = gain >= gate["min_speedup"]
            out.append(
                (
                    ok,
                    f"speedup {gain:.2f}x {where} ({tok_s:.1f} tok/s with speculation, {base['output_tok_s']:.1f}"
                    f" without) {'meets' if ok else 'is below'} min_speedup {gate['min_speedup']}",
                )
            )
    if gate.get("min_accept_length") is not None:
        accept = levels[c].get("accept_length")
        ok = accept is not None and accept >= gate["min_accept_length"]
        out.append((ok, f"accept length {accept if accept is None else round(accept, 2)} {where} "
                        f"{'meets' if ok else 'is below'} min_accept_length {gate['min_accept_length']}"))
    if gate.get("max_regression_pct") is not None:
        rule = f"max_regression_pct {gate['max_regression_pct']}"
        before = {lv["concurrency"]: lv["figures"] for lv in (previous or {}).get("spec", [])}.get(c)
        if previous and previous.get("load") != perf.get("load"):
            out.append((True, f"{rule} not checked: the previous record ran another load"))
        elif not before or before["output_tok_s"] <= 0:
            out.append((True, f"{rule} not checked: no earlier record {where}"))
        else:
            drop = 100.0 * (before["output_tok_s"] - tok_s) / before["output_tok_s"]
            out.append((drop <= gate["max_regression_pct"],
                        f"{tok_s:.1f} tok/s {where} is {abs(drop):.0f}% {'below' if drop >= 0 else 'above'} the "
                        f"previous release's {before['output_tok_s']:.1f} ({rule})"))
    return out


def evaluate(gate: dict, perf: dict, previous: dict | None) -> list[str]:
    """What of a service's gate a spec-bench result fails, one line each (empty: it passes)."""
    return [text for ok, text in checks(gate, perf, previous) if not ok]


def refuse_ungated(hosts) -> None:
    """`deploy --bench` over hosts where no SGLang service has a gate measures nothing: refused,
    naming them; where only some have one, the others are named on stderr before the run."""
    held, loose = [], []
    for h in hosts:
        for svc in kinds.of_kind(h, "sglang"):
            (held if svc.get("gate") else loose).append(f"{h.name}: {svc['name']}")
    if not held:
        raise UsageError(f"--bench holds each service to its gate, and no selected service has one "
                         f"({', '.join(loose) or 'no SGLang service'}): give the service one, e.g. {EXAMPLE}, "
                         f"or deploy without --bench")
    if loose:
        print(f"--bench: not held to a gate (they have none; add one, e.g. {EXAMPLE}): {', '.join(loose)}",
              file=sys.stderr)


def gated(run, fallback: dict | None = None) -> list[dict]:
    """The bench of `inv deploy --bench` (pipeline.deploy's `bench`): the services' records, or
    SpecopsError naming each rule a service failed.  `fallback`: service → the gate it is held to
    when it has none of its own (spec-tune --apply's)."""
    # The release this deploy replaces (or, a no-op, the one it keeps): its record is "previous".
    current = next((r for r in run.call(protocol.Releases()).releases if r["current"]), None)
    results, failures = [], []
    for kind, svc in kinds.of_host(run.host):
        gate, name = svc.get("gate") or (fallback or {}).get(svc["name"]), svc["name"]
        if not gate:
            if kind.name == "sglang":
                run.say(f"{name}: not held to a gate: it has none (add one, e.g. {EXAMPLE})")
            continue
        if not svc.get("speculative"):
            raise SpecopsError(f"{name}: a gate measures speculative decoding, and the service runs none")
        load = specbench.Load(**(gate.get("load") or {}))
        spec, base = specbench.measured(run, svc, load, gate.get("min_speedup") is not None,
                                        verify_mod.checks(run) if run.applied else None)
        perf = specbench.result(run, svc, load, spec, base)
        run.say(perf["verdict"])
        said = checks(gate, perf, ((current or {}).get("perf") or {}).get(name))
        fails = [text for ok, text in said if not ok]
        run.report.extra.setdefault("gate", {})[name] = {"passed": not fails, "checks": [text for _, text in said]}
        if fails:
            failures += [f"{name}: gate: {text}" for text in fails]
        else:
            run.say(f"{name}: gate passed: {'; '.join(text for _, text in said)}")
            run.report.notes.append(f"{name} gate passed")
        results.append(perf)
    if failures:
        raise GateFailed("; ".join(failures), results)
    return results
