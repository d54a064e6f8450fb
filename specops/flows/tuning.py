"""`inv spec-tune`, the controller's side: which speculative settings pay off on this host?

Checklist (the pure parts are specops/sglang/tuning.py):
  1. the space: the service's `tune:` grid, pruned with SGLang's rules, said before any restart;
  2. the service as it runs now, measured without a restart (short and full load), and its own
     last startup time, so the expected time is said before the first restart;
  3. one GPU window (specbench.window): the baseline once, then candidates as transient units,
     a short load each along the climb, the full load to the finalists; at most `budget` restarts;
  4. the service restarted on its own settings and verified, whatever happened (Ctrl-C too);
  5. the verdict, the inventory lines to write, and every figure kept in tune.json.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from . import specbench
from .. import cli, protocol, services
from ..errors import SpecopsError
from ..sglang import rules, tuning
from ..services.sglang import READY_LINE


@dataclass
class Ask:
    """What the task was asked: the load (None: the gate's, else spec-bench's), the objective's
    options, the budget."""
    load: specbench.Load | None = None
    at: int | None = None
    mean: bool = False
    max_itl_p99: float | None = None
    budget: int | None = None

    @classmethod
    def parse(cls, *, budget, at, mean, max_itl_p99_ms, concurrency, requests, max_new_tokens) -> "Ask":
        """From the task's options (numbers as text); a bad one is refused in one line."""
        load = {k: v for k, v in (
            ("concurrency", cli.positive_ints(concurrency, "--concurrency") if concurrency else None),
            ("requests", cli.whole(requests, "--requests", 1) if requests else None),
            ("max_new_tokens", cli.whole(max_new_tokens, "--max-new-tokens", 1) if max_new_tokens else None))
            if v is not None}
        return cls(load=specbench.Load(**load) if load else None, at=cli.whole(at, "--at", 1) if at else None,
                   mean=mean, budget=cli.whole(budget, "--budget", 2) if budget else None,
                   max_itl_p99=cli.whole(max_itl_p99_ms, "--itl-p99-ms", 1) / 1000 if max_itl_p99_ms else None)

    def load_for(self, svc: dict) -> specbench.Load:
        return self.load or specbench.Load(**((svc.get("gate") or {}).get("load") or {}))


def figures(levels) -> dict:
    return {lv.concurrency: lv.figures for lv in levels}


def running_settings(svc: dict) -> tuning.Settings | None:
    res = rules.resolve(svc["speculative"], page_size=svc.get("page_size"),
                        attention_backend=svc.get("attention_backend"))
    eff = res.effective
    if res.errors or eff.get("speculative_num_steps") is None:
        return None
    return tuning.Settings(eff["speculative_num_steps"], eff["speculative_eagle_topk"],
                           eff["speculative_num_draft_tokens"])


def objective_of(svc: dict, ask: Ask, load: specbench.Load) -> tuning.Objective:
    gate = svc.get("gate") or {}
    at = ask.at or gate.get("at_concurrency") or min(load.concurrency)
    if at not in load.concurrency:
        raise SpecopsError(f"{svc['name']}: the objective is read at concurrency {at}, which the load "
                           f"({', '.join(map(str, load.concurrency))}) does not run")
    return tuning.Objective(at=at, mean=ask.mean, max_itl_p99=ask.max_itl_p99,
                            min_speedup=gate.get("min_speedup") or 1.0)


def short_load(load: specbench.Load, objective: tuning.Objective) -> specbench.Load:
    """The first rung's load: the levels the objective reads, a quarter of the requests."""
    levels = objective.levels(load.concurrency)
    return specbench.Load(concurrency=levels, requests=max(load.requests // 4, max(levels)),
                          warmup=min(load.warmup, 2), max_new_tokens=load.max_new_tokens, seed=load.seed,
                          prompts=load.prompts)


def say_space(run, space: tuning.Space) -> None:
    run.say(space.summary())
    by_rule: dict[str, list] = {}
    for p in space.pruned:
        by_rule.setdefault(p.rule, []).append(p)
    for rule, ps in by_rule.items():
        ex = ps[0]
        asked = ", ".join(f"{k} {v}" for k, v in ex.asked.items())
        run.say(f"  pruned {len(ps)} [{rule}]: " + (f"e.g. {asked} runs as {ex.runs_as.label()}: " if ex.runs_as
                                                  else f"e.g. {asked}: ") + ex.reason)


def tune(run, name: str | None, ask: Ask) -> dict:
    """The body of `inv spec-tune` on one host."""
    run.probe([], extra=protocol.Probe(venvs=[services.venv_of(run.host)]), lock=True)
    svc = specbench.service_of(run.host, name)
    if services.kind_of(svc).name != "sglang" or not svc.get("speculative"):
        raise SpecopsError(f"{svc['name']}: spec-tune searches an SGLang server's speculative settings, "
                           "and this service runs none")
    if not run.call(protocol.Releases()).current:
        raise SpecopsError(f"{run.host.name}: no release to keep the result in: deploy first")
    space = tuning.prune(svc, tuning.asked_space(svc, svc.get("tune")))
    if not space.candidates:
        raise SpecopsError(f"{svc['name']}: no settings in the space can run: {space.pruned[0].reason}")
    say_space(run, space)
    load = ask.load_for(svc)
    objective = objective_of(svc, ask, load)
    short = short_load(load, objective)
    run.say(f"objective: {objective.describe()}")
    now = running_settings(svc)
    run.say(f"measuring {svc['name']} as it runs ({now.label() if now else 'SGLang chooses'}): no restart")
    mine = {"short": specbench.measure(run, svc, short), "full": specbench.measure(run, svc, load)}
    budget = ask.budget or (svc.get("tune") or {}).get("budget") or len(space.candidates) + 1
    started = run.call(protocol.Startup(unit=services.kind_of(svc).unit(svc).name, ready_line=READY_LINE)).seconds
    short_s, full_s = (sum(lv.figures.get("seconds") or 0 for lv in mine[k]) for k in ("short", "full"))
    long_runs = 1 + min(3, max(budget - 2, 0))  # the baseline and the finalists run the full load
    each = f"{started:.0f} s start (its last, measured) + {short_s:.0f} s short load ({full_s:.0f} s full)" \
        if started is not None else f"its start (not in its journal: unknown) + {short_s:.0f} s load"
    run.say(f"at most {budget} restarts (the grid would need {space.grid + 1}), each {each}"
            + (f": at most {(budget * started + (budget - long_runs) * short_s + long_runs * full_s) / 60:.1f} min"
               if started is not None else ""))
    search = Search(run, svc, space, objective, load, short, budget)
    specbench.window(run, svc, lambda serve: search.search(serve, now, mine))
    out = search.record(now, mine)
    for line in out["said"]:
        run.say(line)
    rec = run.call(protocol.PerfRecord(perf=out, record="tune"))
    run.report.notes.append(f"tune.json in release {rec.stamp}")
    run.report.extra["spec_tune"] = {k: out[k] for k in ("winner", "verdict", "draft_limit", "restarts", "grid_restarts")}
    return out


class Search:
    """The window's body: the baseline, the climb on the short load, the finalists on the full one."""

    def __init__(self, run, svc, space, objective, load, short, budget):
        self.run, self.svc, self.space, self.objective = run, svc, space, objective
        self.load, self.short, self.budget = load, short, budget
        self.base, self.measured, self.restarts, self.climb = [], [], 0, None

    def candidate_argv(self, s: tuning.Settings) -> list[str]:
        spec = dict(self.svc["speculative"], **s.spec())
        if spec["algorithm"].upper() == "DFLASH" and spec.get("dflash_block_size") is not None:
            spec["dflash_block_size"] = s.num_draft_tokens
        return services.kind_of(self.svc).argv({**self.svc, "speculative": spec}, services.venv_of(self.run.host))

    def measure(self, serve, s: tuning.Settings, load, rung: str) -> float | None:
        self.restarts += 1
        with serve(self.candidate_argv(s), label="candidate", what=s.label()) as unit:
            levels = specbench.measure(self.run, self.svc, load, unit=unit)
        score, why = self.objective.score(figures(levels), figures(self.base))
        gain = self.objective.speedup(figures(levels), figures(self.base))
        accept = figures(levels).get(self.objective.at, {}).get("accept_length")
        self.measured.append({"settings": s, "rung": rung, "levels": levels, "score": score, "out": why or None})
        self.run.say(f"{s.label()} [{rung}]: " + (why if score is None else
                     f"{gain:.2f}x" + (f", accept length {accept:.2f}" if accept else "")))
        return score

    def search(self, serve, now, mine):
        self.run.say("starting the baseline (no speculation)")
        self.restarts += 1
        with serve(specbench.plain_argv(self.run, self.svc)) as unit:
            self.base = specbench.measure(self.run, self.svc, self.load, unit=unit)
        known = {}
        if now in self.space.candidates:
            known[now] = self.objective.score(figures(mine["short"]), figures(self.base))[0]
        start = now if now in self.space.candidates else tuning.middle(self.space.candidates)
        # keep a restart for a finalist's full load
        self.climb = tuning.climb(self.space.candidates, lambda s: self.measure(serve, s, self.short, "short"),
                                  start, max(self.budget - 2, 1), known)
        for s in tuning.finalists(self.climb):
            if s == now or self.restarts >= self.budget:
                continue
            self.measure(serve, s, self.load, "full")

    def record(self, now, mine) -> dict:
        """The verdict and what tune.json keeps."""
        obj, base = self.objective, figures(self.base)
        full = {m["settings"]: m for m in self.measured if m["rung"] == "full"}
        if now is not None:
            full.setdefault(now, {"settings": now, "levels": mine["full"],
                                  "score": obj.score(figures(mine["full"]), base)[0]})
        finals = [s for s in tuning.finalists(self.climb) if s in full] or tuning.finalists(self.climb)
        judged = {s: (full[s] if s in full else next(m for m in self.measured if m["settings"] == s)) for s in finals}
        judged = {s: m for s, m in judged.items() if m["score"] is not None}  # out on the full load: out
        best = max(judged, key=lambda s: judged[s]["score"], default=None)
        said, winner, kept = [], None, False
        at = "the mean over the levels" if obj.mean else f"concurrency {obj.at}"
        if best is not None:
            gain = obj.speedup(figures(judged[best]["levels"]), base)
            if gain is not None and gain >= obj.min_speedup:
                winner = best
                mine_score = full[now]["score"] if now in full else None
                if now is not None and now != best and mine_score and \
                        judged[best]["score"] <= mine_score * (1 + tuning.KEEP_MARGIN):
                    winner, kept = now, True
            if winner:
                won = full.get(winner) or judged[winner]
                verdict = (f"best: {winner.label()}: {obj.speedup(figures(won['levels']), base):.2f}x at {at}"
                           + (" (what it runs now: nothing found beats it by 3%)" if kept else ""))
            else:
                verdict = (f"no settings beat serving without speculation by {obj.min_speedup}x at {at}: the best, "
                           f"{best.label()}, is {gain or 0:.2f}x; serve {self.svc['name']} without speculation "
                           f"(remove its `speculative:`)")
        else:
            verdict = "no candidate could be measured"
        said.append(verdict)
        said.append(f"{self.restarts} restarts (the full grid: {self.space.grid + 1})"
                    + ("; the budget ran out before the search converged" if self.climb.budget_spent else ""))
        accepts = {m["settings"]: figures(m["levels"]).get(obj.at, {}).get("accept_length") for m in self.measured}
        limit = tuning.draft_limit(accepts)
        if limit:
            said.append(limit)
        lines = inventory_lines(self.run.host.name, self.svc["name"], winner) if winner and winner != now else []
        said += lines
        enc = lambda levels: [protocol.encode(lv) for lv in levels]  # noqa: E731
        return {"service": self.svc["name"], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "objective": {"at": obj.at, "mean": obj.mean, "max_itl_p99": obj.max_itl_p99,
                              "min_speedup": obj.min_speedup, "text": obj.describe()},
                "load": self.load.identity(), "short_load": self.short.identity(), "baseline": enc(self.base),
                "incumbent": {"settings": now.spec() if now else None, "levels": enc(mine["full"])},
                "candidates": [{"settings": m["settings"].spec(), "label": m["settings"].label(), "rung": m["rung"],
                                "levels": enc(m["levels"]), "score": m["score"], "out": m["out"],
                                "speedup": {str(c): round(f["output_tok_s"] / base[c]["output_tok_s"], 3)
                                            for c, f in figures(m["levels"]).items()
                                            if base.get(c, {}).get("output_tok_s")}} for m in self.measured],
                "pruned": [{"asked": p.asked, "reason": p.reason, "runs_as": p.runs_as.spec() if p.runs_as else None}
                           for p in self.space.pruned],
                "path": [s.label() for s in self.climb.path], "winner": winner.spec() if winner else None,
                "kept": kept, "changes": bool(winner and winner != now), "verdict": verdict, "draft_limit": limit,
                "restarts": self.restarts, "grid_restarts": self.space.grid + 1, "budget": self.budget,
                "budget_spent": self.climb.budget_spent, "said": said, "inventory_lines": lines}


def inventory_lines(host: str, service: str, s: tuning.Settings) -> list[str]:
    return [f"to serve it, write under {service}'s `speculative:` (host_vars/{host}.yml, or a group's vars "
            f"to roll it with inv deploy --group G --serial 1 --bench):"] + \
        [f"    {k}: {v}" for k, v in s.spec().items()]
