"""`inv spec-tune --apply`: the winner written into each tuned host's vars file (comments and order
kept: specops/inventory/writeback.py) and deployed with `--bench`, so a gate holds it: the
service's own, or, when it has none, one made of the tune's objective (its min_speedup at its
concurrency, with the tune's load).  A host whose file already holds the winner, or whose tune
found nothing better than what it runs, or nothing that pays, is left alone.

Nothing half-done: every file is checked before the first is written, and if the deploy does not
end well (a gate refused, a host failed, Ctrl-C) the files are put back as they were, so the
inventory never asks for settings no gate held.  A tune whose baseline moved more than the keep
margin (noisy figures) is refused unless --force; a winning draft other than the service's own is
written as draft_model_path, beside the settings, unless the service fetches its draft from a
`draft_weights:` source (which would then fetch the old one there)."""
from __future__ import annotations

from pathlib import Path

from . import gate, pipeline
from .. import cli, kinds
from ..prompts import DEFAULT_NAME
from ..errors import UsageError
from ..inventory import writeback


def _fallback_gates(reports) -> dict:
    """host → service → the gate a service without one is held to: what the tune asked of it."""
    out: dict = {}
    for r in reports:
        rec = r.result or {}
        obj, load = rec.get("objective") or {}, rec.get("load") or {}
        if rec.get("changes"):
            out.setdefault(r.name, {})[rec["service"]] = {
                "min_speedup": obj.get("min_speedup", 1.0), "at_concurrency": obj.get("at"),
                "load": {**{k: load[k] for k in ("concurrency", "requests", "warmup", "max_new_tokens", "seed")
                            if k in load},
                         # a traffic sample is gone with its tune: the gate measures on the prompt file
                         **({"prompts": load["prompts"]} if load.get("prompts") not in (None, DEFAULT_NAME)
                            and "traffic" not in load else {})}}
    return out


def refusal(name: str, rec: dict, svc: dict | None, force: bool) -> str | None:
    """Why this host's winner must not be written (None: it may)."""
    if (rec.get("noise") or {}).get("noisy") and not force:
        return (f"{name}: the tune's figures are noisy (the baseline moved {rec['noise']['baseline_moved']:+.1%} "
                f"during it): not applied; tune again when the box is quiet, or give --force")
    other = (rec.get("apply") or {}).get("draft_model_path")
    for key, what in (("draft_weights", "brings its draft from `draft_weights:`, which would fetch the old one "
                                         "there"),
                      ("draft_config", "sets `draft_config:` keys made for its own draft, which deploy would "
                                       "write into the winner's config.json (it was measured without them)")):
        if other and (svc or {}).get(key):
            return (f"{name}: {rec['service']} {what}; the winner is another draft ({other}): write draft_model_path "
                    f"and {key} yourself")
    return None


def _service(hosts, name: str, rec: dict) -> dict | None:
    return next((s for h in hosts if h.name == name for _, s in kinds.of_host(h) if s["name"] == rec["service"]),
                None)


def apply(sel, reports, deploy, vocabulary: dict, force: bool = False) -> None:
    """`deploy(body)` runs a deploy of the selection with `body` as pipeline.deploy's bench step
    (`vocabulary`: the inventory's, to read a winning draft's service).  Nothing is written when
    any host is refused."""
    inventory = Path(cli.inventory_path(sel.inventory))  # the one the tune selected its hosts from
    todo, hosts = [], None
    refused = []
    for r in reports:
        rec = r.result or {}
        if rec.get("changes"):
            # the inventory's entry matters only to a winner that is another draft
            hosts = hosts or (cli.select(sel, vocabulary) if "draft_model_path" in rec["apply"] else None)
            why = refusal(r.name, rec, _service(hosts or [], r.name, rec), force)
            refused += [why] if why else []
    if refused:
        raise UsageError("; ".join(refused))
    for r in reports:
        rec = r.result or {}
        if not rec.get("changes"):
            print(f"{r.name}: {rec.get('service', 'the service')}: nothing to apply "
                  f"({'what it runs is the best found' if rec.get('winner') else 'no settings pay off'})")
            continue
        path = writeback.vars_file(inventory, r.name)
        if writeback.write_speculative(path, rec["service"], rec["apply"], dry=True):
            todo.append((r.name, path, rec))
        else:
            print(f"{r.name}: {path} already holds the winner: nothing to apply")
    if not todo:
        return
    before = {path: path.read_text() for _, path, _ in todo}
    done = False
    try:
        for name, path, rec in todo:
            writeback.write_speculative(path, rec["service"], rec["apply"])
            print(f"{name}: wrote {', '.join(f'{k} {v}' for k, v in rec['apply'].items())} into {path}")
        fallback = _fallback_gates(reports)
        sel.host, sel.group, sel.all = ",".join(name for name, _, _ in todo), None, False
        deploy(lambda run: pipeline.deploy(run, lambda run_: gate.gated(run_, fallback.get(run_.host.name))))
        done = True
    finally:
        if not done:
            for path, text in before.items():
                writeback.put_back(path, text)
                print(f"{path}: put back as it was (the winner was not deployed under a gate)")
