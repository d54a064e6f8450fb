"""What a spec-tune concludes from its Search (tuning_search.py), and what tune.json keeps: the
winner across drafts (what runs now stays unless beaten by KEEP_MARGIN), the verdict, each
draft's best and its figures per draft-token count, how far the baseline moved (noise), whether
the draft itself is the limit, and the inventory lines to write."""
from __future__ import annotations

import time

from . import specbench
from .. import again, protocol
from ..sglang import tuning
from .tuning_search import Search, figures


def baseline_moved(s: Search) -> float | None:
    """The baseline at the end against the one at the start, read as the objective reads a
    speedup, minus 1 (None: not measured again)."""
    ratio = s.objective.speedup(figures(s.base_again), figures(s.base))
    return ratio - 1 if ratio is not None else None


def per_draft(s: Search, draft: str) -> dict:
    """A draft's best settings and, per draft-token count, its best speedup and that one's accept
    length (the HTML page draws the drafts side by side from these)."""
    base, at = figures(s.base), s.objective.at
    judged = s.judged(draft)
    best = max(judged, key=lambda x: judged[x]["score"], default=None)
    by_tokens: dict = {}
    for m in s.measured:
        if m["draft"] != draft or m["score"] is None:
            continue
        gain = s.objective.speedup(figures(m["levels"]), base)
        n = m["settings"].num_draft_tokens
        if gain is not None and (n not in by_tokens or gain > by_tokens[n]["speedup"]):
            by_tokens[n] = {"speedup": round(gain, 4), "settings": m["settings"].spec(),
                            "accept_length": figures(m["levels"]).get(at, {}).get("accept_length")}
    return {"draft": draft, "best": best.spec() if best else None,
            "speedup": s.objective.speedup(figures(judged[best]["levels"]), base) if best else None,
            "by_draft_tokens": {str(n): by_tokens[n] for n in sorted(by_tokens)}}


def record(s: Search, now: tuning.Settings | None) -> dict:
    """The verdict and what tune.json keeps."""
    obj, base, own = s.objective, figures(s.base), s.svc["speculative"].get("draft_model_path")
    judged = {(d, x): m for d in s.drafts for x, m in s.judged(d).items()}
    gain = {k: obj.speedup(figures(m["levels"]), base) for k, m in judged.items()}
    pays = [k for k in judged if gain[k] is not None and gain[k] >= obj.min_speedup]
    best = max(judged, key=lambda k: judged[k]["score"], default=None)
    winner = max(pays, key=lambda k: judged[k]["score"], default=None)
    # what runs now stays unless the winner beats it by KEEP_MARGIN (noise must not churn a fleet)
    incumbent = (own, now)
    kept = winner is not None and incumbent in pays and incumbent != winner and \
        judged[winner]["score"] <= judged[incumbent]["score"] * (1 + tuning.KEEP_MARGIN)
    top, winner = winner, incumbent if kept else winner
    at = "the mean over the levels" if obj.mean else f"concurrency {obj.at}"
    named = lambda k: k[1].label() + s.draft_label(k[0])  # noqa: E731
    if kept:
        verdict = (f"what runs now ({named(winner)}) stays: {gain[winner]:.2f}x at {at}; the best measured, "
                   f"{named(top)} at {gain[top]:.2f}x, does not beat it by {tuning.KEEP_MARGIN:.0%}")
    elif winner and winner == incumbent:
        verdict = f"what runs now ({named(winner)}) is already the best measured: {gain[winner]:.2f}x at {at}"
    elif winner:
        verdict = f"best: {named(winner)}: {gain[winner]:.2f}x at {at}"
    elif best:
        verdict = (f"no settings {obj.bar()} at {at}: the best, {named(best)}, is {gain[best] or 0:.2f}x; "
                   f"serve {s.svc['name']} without speculation (remove its `speculative:`)")
    else:
        verdict = "no candidate could be measured"
    spent = any(c.budget_spent for c in s.climbs.values())
    said = [verdict, f"{s.restarts} restarts, where the full grid would need {s.space.grid_words(len(s.drafts))}"
            + ("; the budget ran out before the search converged" if spent else "")]
    drafts = [per_draft(s, d) for d in s.drafts]
    if len(s.drafts) > 1:
        said += [f"  draft {d['draft']}: " + (f"best {tuning.Settings(**d['best']).label()}, {d['speedup']:.2f}x"
                                             if d["best"] and d["speedup"] is not None else "nothing measured")
                 for d in drafts]
    again = [m for m in s.measured if m.get("again")]
    if again:
        said.append(f"{len(again)} reading(s) measured again, the first far below their neighbours' "
                    f"(a slow start, not the settings): the better reading stands")
    moved = baseline_moved(s)
    noisy = moved is not None and abs(moved) > tuning.KEEP_MARGIN
    if moved is None:
        said.append("the baseline could not be measured again at the end: how noisy the figures were is not known")
    if noisy:
        said.append(f"the figures are noisy: the baseline moved {moved:+.1%} between the start and the end of the "
                    f"tune, more than the {tuning.KEEP_MARGIN:.0%} a winner must clear; --apply refuses this tune "
                    f"unless --force (run it again when the box is quiet)")
    limit = tuning.draft_limit({m["settings"]: figures(m["levels"]).get(obj.at, {}).get("accept_length")
                                for m in s.measured if m["draft"] == (winner or best or (own,))[0]}, s.run.host.name)
    said += [limit] if limit else []
    changes = bool(winner and winner != incumbent)
    values = s.values(winner[1], winner[0]) if changes else None
    enc = lambda levels: [protocol.encode(lv) for lv in levels]  # noqa: E731
    return {"service": s.svc["name"], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "objective": {"at": obj.at, "mean": obj.mean, "max_itl_p99": obj.max_itl_p99,
                          "min_speedup": obj.min_speedup, "text": obj.describe()},
            "load": s.load_identity, "short_load": s.short_identity, "baseline": enc(s.base),
            "baseline_again": enc(s.base_again), "noise": {"baseline_moved": moved, "noisy": noisy},
            "incumbent": {"settings": now.spec() if now else None, "draft": own},
            "drafts": drafts,
            "candidates": [{"draft": m["draft"], "settings": m["settings"].spec(),
                            "label": m["settings"].label() + s.draft_label(m["draft"]), "rung": m["rung"],
                            "again": m.get("again", False), "levels": enc(m["levels"]), "score": m["score"],
                            "out": m["out"],
                            "speedup": {str(c): g for c, g in specbench.speedups(m["levels"], s.base).items()}}
                           for m in s.measured],
            "pruned": [{"asked": p.asked, "reason": p.reason, "rule": p.rule,
                        "runs_as": p.runs_as.spec() if p.runs_as else None} for p in s.space.pruned if not p.kept],
            "path": {d: [x.label() for x in c.path] for d, c in s.climbs.items()},
            "winner": winner[1].spec() if winner else None, "winner_draft": winner[0] if winner else None,
            "apply": values, "kept": kept, "changes": changes, "verdict": verdict, "draft_limit": limit,
            "restarts": s.restarts, "grid_restarts": s.space.grid_restarts(len(s.drafts)), "budget": s.budget,
            "budget_spent": spent, "said": said,
            "inventory_lines": inventory_lines(s.run.host.name, s.svc["name"], values) if changes else []}


def inventory_lines(host: str, service: str, values: dict) -> list[str]:
    roll = again.command("deploy", "--group", "G", "--serial", "1", "--bench")
    return [f"to serve it, write under {service}'s `speculative:` (host_vars/{host}.yml, or a group's vars "
            f"to roll it with `{roll}`):"] + [f"    {k}: {v}" for k, v in values.items()]
