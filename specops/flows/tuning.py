"""`inv spec-tune`, the controller's side: which speculative settings pay off on this host?

Checklist (the pure parts are specops/sglang/tuning.py; the window's body is tuning_search.py,
the verdict tuning_record.py):
  1. the space: the service's `tune:` grid, pruned with SGLang's rules, said before any restart;
  2. the drafts to compare (`tune: {drafts: [...]}`, else the service's own), each checked as
     deploy checks the service's draft (weights there, EAGLE-3 layer ids the target captures);
     with --traffic (or `tune: {traffic: N}`), a sample of what the service serves, taken while it
     serves (flows/traffic.py), is the load of every measurement below, and dropped at the end;
  3. what the service runs must be what the inventory says (else its figures would be misnamed);
  4. the expected time (flows/pace.py), from the service's own last start and a short load on it
     as it runs; and after each candidate, from what this run measured so far;
  5. one GPU window (transient.window): the baseline once, then per draft candidates as transient
     units, what runs now among them, a short load each along the climb (warm-up requests first,
     not counted), the full load to the finalists; the baseline again at the end (noise);
     at most `budget` restarts per draft;
  6. the service restarted on its own settings and verified, whatever happened (Ctrl-C too);
  7. the verdict, the inventory lines to write, and every figure kept in tune.json.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import pace, specbench, traffic as traffic_mod, transient
from .tuning_record import record
from .tuning_search import Search
from .. import cli, kinds, protocol
from ..errors import SpecopsError, UsageError
from ..ops import merge_wants
from ..sglang import climb, drafts as drafts_mod, rules, spec as spec_mod, tuning
from ..sglang.patches import provides_embedding_capture


@dataclass
class Ask:
    """What the task was asked: load options over the gate's load (else spec-bench's), the
    objective's options, the budget (restarts per draft), --force (apply a noisy tune)."""
    load: dict = field(default_factory=dict)
    at: int | None = None
    mean: bool = False
    max_itl_p99: float | None = None
    budget: int | None = None
    force: bool = False
    traffic: traffic_mod.Traffic | None = None  # --traffic: measure on a sample of what the service serves

    @classmethod
    def parse(cls, *, budget, at, mean, max_itl_p99_ms, concurrency, requests, max_new_tokens, prompts=None,
              seed=None, force=False, traffic=None) -> "Ask":
        """From the task's options (numbers as text); a bad one is refused in one line."""
        load = {k: v for k, v in (
            ("concurrency", cli.positive_ints(concurrency, "--concurrency") if concurrency else None),
            ("requests", cli.whole(requests, "--requests", 1) if requests else None),
            ("max_new_tokens", cli.whole(max_new_tokens, "--max-new-tokens", 1) if max_new_tokens else None),
            ("prompts", prompts), ("seed", cli.whole(seed, "--seed", 0) if seed is not None else None))
            if v is not None}
        ask = cls(load=load, at=cli.whole(at, "--at", 1) if at else None, mean=mean, force=force,
                   budget=cli.whole(budget, "--budget", tuning.MIN_ASKED_BUDGET) if budget else None,
                   max_itl_p99=cli.whole(max_itl_p99_ms, "--itl-p99-ms", 1) / 1000 if max_itl_p99_ms else None,
                   traffic=traffic)
        if traffic and prompts:
            raise UsageError("--traffic measures on what the service serves: give it or --prompts, not both")
        ask.load_for({}).prompt_list()  # a malformed prompt file is refused before any connection
        return ask

    def load_for(self, svc: dict) -> specbench.Load:
        """The gate's load with the options given on top, key by key."""
        return specbench.Load(**{**((svc.get("gate") or {}).get("load") or {}), **self.load})


def running_settings(svc: dict) -> tuning.Settings | None:
    res = rules.resolve(svc["speculative"], page_size=svc.get("page_size"),
                        attention_backend=svc.get("attention_backend"))
    eff = res.effective
    if res.errors or eff.get("speculative_num_steps") is None:
        return None
    return tuning.Settings.of(eff)


def objective_of(svc: dict, ask: Ask, load: specbench.Load) -> tuning.Objective:
    gate = svc.get("gate") or {}
    at = ask.at or gate.get("at_concurrency") or min(load.concurrency)
    if at not in load.concurrency:
        raise SpecopsError(f"{svc['name']}: the objective is read at concurrency {at}, which the load "
                           f"({', '.join(map(str, load.concurrency))}) does not run")
    return tuning.Objective(at=at, mean=ask.mean, max_itl_p99=ask.max_itl_p99,
                            min_speedup=gate.get("min_speedup") or 1.0)


def short_load(load: specbench.Load, objective: tuning.Objective) -> specbench.Load:
    """The first rung's load: the levels the objective reads, a quarter of the requests, after at
    least one warm-up request (a fresh server's first requests pay compiles and cold caches)."""
    levels = objective.levels(load.concurrency)
    return replace(load, concurrency=levels, requests=max(load.requests // 4, max(levels)),
                   warmup=max(1, min(load.warmup, 2)))


def say_space(run, space: tuning.Space) -> None:
    run.say(space.summary())
    by_rule: dict[str, list] = {}
    for p in space.pruned:
        if not p.kept:  # measured, as SGLang runs it: one of the distinct settings the header counts
            by_rule.setdefault(p.rule, []).append(p)
    for rule, ps in by_rule.items():
        ex = ps[0]
        asked = ", ".join(f"{k} {v}" for k, v in ex.asked.items())
        run.say(f"  pruned {len(ps)} [{rule}]: " + (f"e.g. {asked} runs as {ex.runs_as.label()}: " if ex.runs_as
                                                  else f"e.g. {asked}: ") + ex.reason)


def check_runs_as_asked(run, svc: dict, releases) -> None:
    """What runs is the current release's: the inventory must ask for the same speculative settings,
    or the figures of what runs would carry the inventory's names."""
    current = next((r for r in releases.releases if r["current"]), {})
    deployed = (current.get("spec") or {}).get(svc["name"]) or {}
    asked = spec_mod.intended(svc)
    differ = [k for k in asked if k.startswith("speculative_") and deployed.get(k) != asked[k]]
    if differ:
        raise SpecopsError(f"{svc['name']}: the inventory asks for {differ[0]} = {asked[differ[0]]}, the current "
                           f"release runs {deployed.get(differ[0])}: deploy first, then tune what runs")


def estimate(run, svc: dict, search: Search, grid: str) -> None:
    """Said before the first restart: at most how many restarts, and about how long they take
    (flows/pace.py): a short load on the service as it runs sets this host's pace, the service's
    last start (from its journal) a switch's length until one is measured, and the plan is every
    restart the budget allows, the finalists' full loads and the baseline's again included."""
    search.pace.start = specbench.last_start(run, svc)
    search.pace.mark()
    took = search.ran(specbench.measure(run, svc, search.short), search.short, "short")
    plan = search.ahead()
    longest = search.pace.left(plan)
    each = f"{search.pace.start:.0f} s start (its last, measured)" if search.pace.start is not None else \
        "a start (its last is not in its journal: unknown)"
    # every switch of the plan is a restart of a transient unit but the last, the service's own
    run.say(f"at most {sum(s.switch for s in plan) - 1} restarts, where the full grid would need {grid}; each {each} "
            f"+ {took:.0f} s of short load"
            + (f": {pace.about(longest)} if all are used" if longest is not None else ""))


def drafts_of(svc: dict) -> list[str]:
    """The drafts to compare: the service's own, then `tune.drafts` (what runs now is always
    measured: a winner must beat it by the keep margin)."""
    own = svc["speculative"].get("draft_model_path")
    asked = (svc.get("tune") or {}).get("drafts")
    if not asked:
        return [own]
    if not own:
        raise SpecopsError(f"{svc['name']}: tune.drafts compares draft checkpoints; {svc['speculative']['algorithm']} "
                           f"here runs none (no speculative.draft_model_path)")
    bad = [d for d in asked if not isinstance(d, str) or not d.startswith("/")]
    named = [d.rstrip("/") or "/" for d in asked if d not in bad]
    if bad or len(set(named)) != len(named):
        raise SpecopsError(f"{svc['name']}: tune.drafts must be distinct absolute paths on the host"
                           + (f", not {bad[0]!r}" if bad else ""))
    return [own] + [d for d in named if d != own.rstrip("/")]


def check_drafts(run, svc: dict, drafts: list[str], facts) -> None:
    capture = provides_embedding_capture(run.host, svc)
    for d in drafts:
        drafts_mod.check(svc, d, facts, capture)
    if len(drafts) > 1:
        run.say(f"{len(drafts)} drafts to compare: {', '.join(drafts)}")


def tune(run, name: str | None, ask: Ask) -> dict:
    """The body of `inv spec-tune` on one host."""
    svc = specbench.service_of(run.host, name)
    if kinds.kind_of(svc).name != "sglang" or not svc.get("speculative"):
        raise SpecopsError(f"{svc['name']}: spec-tune searches an SGLang server's speculative settings, "
                           "and this service runs none")
    drafts = drafts_of(svc)
    extra = protocol.Probe(venvs=[kinds.venv_of(run.host)])
    facts = run.probe([], extra=merge_wants([extra, drafts_mod.wants(svc, [d for d in drafts if d])]), lock=True)
    releases = run.call(protocol.Releases())
    if not releases.current:
        raise SpecopsError(f"{run.host.name}: no release to keep the result in: deploy first")
    check_runs_as_asked(run, svc, releases)
    space = tuning.prune(svc, tuning.asked_space(svc, svc.get("tune")))
    if not space.candidates:
        raise SpecopsError(f"{svc['name']}: no settings in the space can run: {space.pruned[0].reason}")
    say_space(run, space)
    check_drafts(run, svc, [d for d in drafts if d], facts)
    sample = traffic_mod.asked(svc, ask.traffic, ask.load.get("prompts"))
    if sample:
        traffic_mod.refuse(run, svc, facts)
    load = ask.load_for(svc)
    objective = objective_of(svc, ask, load)
    run.say(f"objective: {objective.describe()}")
    budget = ask.budget or (svc.get("tune") or {}).get("budget") or climb.default_budget(space)
    with traffic_mod.sampled(run, svc, sample) as taken:  # taken while it serves, before the window
        load = replace(load, sample=taken)
        search = Search(run, svc, space, objective, load, short_load(load, objective), budget, drafts)
        estimate(run, svc, search, space.grid_words(len(drafts)))
        now = running_settings(svc)
        transient.window(run, svc, lambda serve: search.search(serve, now))
        out = record(search, now)
    for line in out["said"]:
        run.say(line)
    rec = run.call(protocol.PerfRecord(perf=out, record="tune"))
    run.report.notes.append(f"tune.json in release {rec.stamp}")
    run.report.extra["spec_tune"] = {k: out[k] for k in ("winner", "winner_draft", "verdict", "draft_limit",
                                                         "restarts", "grid_restarts", "noise")}
    return out
