"""`inv spec-tune --apply`: the winner written into each tuned host's vars file (comments and order
kept: specops/inventory/writeback.py) and deployed with `--bench`, so a gate holds it: the
service's own, or, when it has none, one made of the tune's objective (its min_speedup at its
concurrency, with the tune's load).  A host whose file already holds the winner, or whose tune
found nothing better than what it runs, or nothing that pays, is left alone."""
from __future__ import annotations

from pathlib import Path

from . import gate, pipeline
from ..cli import DEFAULT_INVENTORY
from ..inventory import writeback


def _fallback_gates(reports) -> dict:
    """service → the gate a service without one is held to: what the tune asked of it."""
    out = {}
    for r in reports:
        rec = r.result or {}
        obj, load = rec.get("objective") or {}, rec.get("load") or {}
        if rec.get("winner"):
            out[rec["service"]] = {"min_speedup": obj.get("min_speedup", 1.0), "at_concurrency": obj.get("at"),
                                   "load": {k: load[k] for k in ("concurrency", "requests", "warmup",
                                                                 "max_new_tokens", "seed") if k in load}}
    return out


def apply(sel, reports, deploy) -> None:
    """`deploy(body)` runs a deploy of the selection with `body` as pipeline.deploy's bench step."""
    inventory = Path(sel.inventory or DEFAULT_INVENTORY)
    changed = []
    for r in reports:
        rec = r.result or {}
        if not rec.get("changes"):
            print(f"{r.name}: {rec.get('service', 'the service')}: nothing to apply "
                  f"({'what it runs is the best found' if rec.get('winner') else 'no settings pay off'})")
            continue
        path = writeback.vars_file(inventory, r.name)
        if writeback.write_speculative(path, rec["service"], rec["winner"]):
            print(f"{r.name}: wrote {', '.join(f'{k} {v}' for k, v in rec['winner'].items())} into {path}")
            changed.append(r.name)
        else:
            print(f"{r.name}: {path} already holds the winner: nothing to apply")
    if not changed:
        return
    fallback = _fallback_gates(reports)
    sel.host, sel.group, sel.all = ",".join(changed), None, False
    deploy(lambda run: pipeline.deploy(run, lambda run_: gate.gated(run_, fallback)))
