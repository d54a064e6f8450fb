"""spec-tune's GPU window body (specops/flows/tuning.py opens the window): the baseline once, the
climb on the short load with each candidate a transient unit, the finalists on the full load;
then the verdict and the record tune.json keeps.

A candidate that does not start or serve (untried settings: out of memory, a crash) is out, with
why, and the search goes on; GPUs left busy after one stops end the tune, as they end any window."""
from __future__ import annotations

import time

from . import specbench
from .. import protocol, services
from ..errors import SpecopsError
from ..sglang import tuning


def figures(levels) -> dict:
    return {lv.concurrency: lv.figures for lv in levels}


class Search:
    def __init__(self, run, svc, space, objective, load, short, budget):
        self.run, self.svc, self.space, self.objective = run, svc, space, objective
        self.load, self.short, self.budget = load, short, budget
        self.base, self.measured, self.restarts, self.climb = [], [], 0, tuning.Climb()

    def values(self, s: tuning.Settings) -> dict:
        """The `speculative` keys a candidate sets (and --apply writes)."""
        spec = tuning.speculative_for(self.svc["speculative"], s.spec())
        return {k: spec[k] for k in (*tuning.KNOBS, "dflash_block_size") if spec.get(k) is not None}

    def measure(self, serve, s: tuning.Settings, load, rung: str) -> float | None:
        self.restarts += 1
        argv = services.kind_of(self.svc).argv({**self.svc, "speculative": {**self.svc["speculative"], **self.values(s)}},
                                                services.venv_of(self.run.host))
        try:
            with serve(argv, label="candidate", what=s.label()) as unit:
                levels = specbench.measure(self.run, self.svc, load, unit=unit)
        except specbench.GpusBusy:
            raise
        except SpecopsError as e:
            self.measured.append({"settings": s, "rung": rung, "levels": [], "score": None, "out": str(e)[:300]})
            self.run.say(f"{s.label()} [{rung}]: out: {str(e)[:200]}")
            return None
        score, why = self.objective.score(figures(levels), figures(self.base))
        gain = self.objective.speedup(figures(levels), figures(self.base))
        accept = figures(levels).get(self.objective.at, {}).get("accept_length")
        self.measured.append({"settings": s, "rung": rung, "levels": levels, "score": score, "out": why or None})
        self.run.say(f"{s.label()} [{rung}]: " + (f"out: {why}" if score is None else f"{gain:.2f}x"
                     + (f", accept length {accept:.2f}" if accept else "")))
        return score

    def search(self, serve, now):
        self.run.say("starting the baseline (no speculation)")
        self.restarts += 1
        with serve(specbench.plain_argv(self.run, self.svc)) as unit:
            self.base = specbench.measure(self.run, self.svc, self.load, unit=unit)
        start = now if now in self.space.candidates else tuning.middle(self.space.candidates)
        # a restart kept for a finalist's full load
        self.climb = tuning.climb(self.space.candidates, lambda s: self.measure(serve, s, self.short, "short"),
                                  start, max(self.budget - 2, 1))
        for s in tuning.finalists(self.climb):
            if self.restarts >= self.budget:
                break
            self.measure(serve, s, self.load, "full")

    def _judged(self) -> dict:
        """The finalists' figures: the full load's where it ran, else (the budget ran out) the short's."""
        full = {m["settings"]: m for m in self.measured if m["rung"] == "full"}
        finals = [s for s in tuning.finalists(self.climb) if s in full] or tuning.finalists(self.climb)
        judged = {s: full.get(s) or next(m for m in self.measured if m["settings"] == s and m["rung"] == "short")
                  for s in finals}
        return {s: m for s, m in judged.items() if m["score"] is not None}

    def record(self, now) -> dict:
        """The verdict and what tune.json keeps."""
        obj, base = self.objective, figures(self.base)
        judged = self._judged()
        gain = {s: obj.speedup(figures(m["levels"]), base) for s, m in judged.items()}
        pays = [s for s in judged if gain[s] is not None and gain[s] >= obj.min_speedup]
        best = max(judged, key=lambda s: judged[s]["score"], default=None)
        winner = max(pays, key=lambda s: judged[s]["score"], default=None)
        # what runs now stays unless the winner beats it by KEEP_MARGIN (noise must not churn a fleet)
        kept = winner is not None and now in pays and now != winner and \
            judged[winner]["score"] <= judged[now]["score"] * (1 + tuning.KEEP_MARGIN)
        winner = now if kept else winner
        at = "the mean over the levels" if obj.mean else f"concurrency {obj.at}"
        if winner:
            verdict = f"best: {winner.label()}: {gain[winner]:.2f}x at {at}" + \
                (" (what it runs now: nothing found beats it by 3%)" if kept else "")
        elif best:
            verdict = (f"no settings beat serving without speculation by {obj.min_speedup}x at {at}: the best, "
                       f"{best.label()}, is {gain[best] or 0:.2f}x; serve {self.svc['name']} without speculation "
                       f"(remove its `speculative:`)")
        else:
            verdict = "no candidate could be measured"
        said = [verdict, f"{self.restarts} restarts (the full grid: {self.space.grid + 1})"
                + ("; the budget ran out before the search converged" if self.climb.budget_spent else "")]
        limit = tuning.draft_limit({m["settings"]: figures(m["levels"]).get(obj.at, {}).get("accept_length")
                                    for m in self.measured})
        said += [limit] if limit else []
        changes = bool(winner and winner != now)
        lines = inventory_lines(self.run.host.name, self.svc["name"], self.values(winner)) if changes else []
        enc = lambda levels: [protocol.encode(lv) for lv in levels]  # noqa: E731
        return {"service": self.svc["name"], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "objective": {"at": obj.at, "mean": obj.mean, "max_itl_p99": obj.max_itl_p99,
                              "min_speedup": obj.min_speedup, "text": obj.describe()},
                "load": self.load.identity(), "short_load": self.short.identity(), "baseline": enc(self.base),
                "incumbent": {"settings": now.spec() if now else None},
                "candidates": [{"settings": m["settings"].spec(), "label": m["settings"].label(), "rung": m["rung"],
                                "levels": enc(m["levels"]), "score": m["score"], "out": m["out"],
                                "speedup": {str(c): g for c, g in specbench.speedups(m["levels"], self.base).items()}}
                               for m in self.measured],
                "pruned": [{"asked": p.asked, "reason": p.reason, "rule": p.rule,
                            "runs_as": p.runs_as.spec() if p.runs_as else None} for p in self.space.pruned],
                "path": [s.label() for s in self.climb.path], "winner": winner.spec() if winner else None,
                "apply": self.values(winner) if changes else None, "kept": kept, "changes": changes,
                "verdict": verdict, "draft_limit": limit, "restarts": self.restarts,
                "grid_restarts": self.space.grid + 1, "budget": self.budget,
                "budget_spent": self.climb.budget_spent, "said": said, "inventory_lines": lines}


def inventory_lines(host: str, service: str, values: dict) -> list[str]:
    return [f"to serve it, write under {service}'s `speculative:` (host_vars/{host}.yml, or a group's vars "
            f"to roll it with inv deploy --group G --serial 1 --bench):"] + [f"    {k}: {v}" for k, v in values.items()]
