"""spec-tune's GPU window body (specops/flows/tuning.py opens the window): the baseline once, then
for each draft the climb on the short load with each candidate a transient unit and its finalists
on the full load (climb.search), then the baseline again, which says how noisy the figures are.

A candidate that does not start or serve (untried settings: out of memory, a crash) is out, with
why, and the search goes on; GPUs left busy after one stops end the tune, as they end any window.
What tune.json keeps and says is tuning_record.py's."""
from __future__ import annotations

from . import pace as pace_mod, specbench, transient
from .. import kinds
from ..errors import SpecopsError
from ..sglang import climb, tuning


def figures(levels) -> dict:
    return {lv.concurrency: lv.figures for lv in levels}


class Search:
    """One service's search over its drafts; `drafts` in the order asked, the service's own first."""

    def __init__(self, run, svc, space, objective, load, short, budget, drafts, pace=None):
        self.run, self.svc, self.space, self.objective = run, svc, space, objective
        self.load, self.short, self.budget, self.drafts = load, short, budget, drafts
        self.pace, self.draft = pace or pace_mod.Pace(), drafts[0]  # the draft searched now
        self.seen: dict = {}  # rung → a candidate's latest readings on its load: what loads to come are modeled on
        self.told: dict = {}  # draft → the full loads its finalists get, once its climb has ended
        # named as they are now, before the window: a file edited during a long tune is not what was sent
        self.load_identity, self.short_identity = load.identity(), short.identity()
        self.base, self.base_again, self.measured, self.restarts = [], [], [], 0
        self.climbs: dict = {}   # draft → climb.Climb
        self.finals: dict = {}   # draft → {settings: full-load score}

    def values(self, s: tuning.Settings, draft: str | None = None) -> dict:
        """The `speculative` keys a candidate sets (and --apply writes): the draft when it is not
        the service's own."""
        spec = tuning.speculative_for(self.svc["speculative"], s.spec())
        out = {k: spec[k] for k in (*tuning.KNOBS, "dflash_block_size") if spec.get(k) is not None}
        if draft and draft != self.svc["speculative"].get("draft_model_path"):
            out["draft_model_path"] = draft
        return out

    def measure(self, serve, draft: str, s: tuning.Settings, load, rung: str) -> float | None:
        self.restarts += 1
        again = any(m["draft"] == draft and m["settings"] == s and m["rung"] == rung for m in self.measured)
        spec = {**self.svc["speculative"], **self.values(s, draft), "draft_model_path": draft}
        argv = kinds.kind_of(self.svc).argv({**self.svc, "speculative": spec}, kinds.venv_of(self.run.host))
        name = f"{s.label()}{self.draft_label(draft)} [{rung}{', again' if again else ''}]"
        started = False
        try:
            with serve(argv, label="candidate", what=s.label() + self.draft_label(draft)) as unit:
                self.pace.switched()
                started = True
                levels = specbench.measure(self.run, self.svc, load, unit=unit)
                self.ran(levels, load, rung)
        except transient.GpusBusy:
            raise
        except SpecopsError as e:
            if started:  # a load cut short: no model to weigh its time by
                self.pace.mark()
            else:  # a start that failed took a restart's time (its unit's stop too)
                self.pace.switched()
            self.measured.append({"draft": draft, "settings": s, "rung": rung, "levels": [], "score": None,
                                  "out": str(e)[:300], "again": again})
            self.run.say(f"{name}: out: {str(e)[:200]}{self.left()}")
            return None
        score, why = self.objective.score(figures(levels), figures(self.base))
        gain = self.objective.speedup(figures(levels), figures(self.base))
        accept = figures(levels).get(self.objective.at, {}).get("accept_length")
        self.measured.append({"draft": draft, "settings": s, "rung": rung, "levels": levels, "score": score,
                              "out": why or None, "again": again})
        self.run.say(f"{name}: " + (f"out: {why}" if score is None else f"{gain:.2f}x"
                     + (f", accept length {accept:.2f}" if accept else ""))
                     + (" (measured again: its first reading was far below its neighbours')" if again else "")
                     + self.left())
        return score

    def ran(self, levels, load, rung: str | None = None) -> float:
        """A load ended now: timed against its model (its wall seconds); a candidate's readings
        model the loads of its rung to come."""
        if rung:
            self.seen[rung] = levels
        return self.pace.loaded(specbench.load_seconds(levels, load))

    def ahead(self) -> list:
        """The steps still to come, at most (flows/pace.py): the baseline, each draft's climb on the
        short load and its finalists' full loads (as many as its budget leaves them, or as the climb
        said once it ended), the baseline again, the service's restart after the window."""
        short_n, full_n = climb.rungs(self.budget)
        short = pace_mod.load(specbench.load_seconds(self.seen.get("short", []), self.short))
        full = pace_mod.load(specbench.load_seconds(self.seen.get("full") or self.seen.get("short", []), self.load))
        steps = [] if self.base else [pace_mod.SWITCH, full]
        for d in self.drafts[self.drafts.index(self.draft):]:
            rungs = [m["rung"] for m in self.measured if m["draft"] == d]
            shorts, fulls = (0, self.told[d]) if d in self.told else (max(short_n - rungs.count("short"), 0), full_n)
            steps += [pace_mod.SWITCH, short] * shorts + [pace_mod.SWITCH, full] * max(fulls - rungs.count("full"), 0)
        again = pace_mod.load(specbench.load_seconds(self.base, self.load)) if self.base else full
        return steps + [pace_mod.SWITCH, again, pace_mod.SWITCH]

    def left(self) -> str:
        """"; about 50 s left" after a candidate's line, at the pace this run measured so far."""
        said = self.pace.says(self.ahead())
        return f"; {said}" if said else ""

    def accept_of(self, draft: str, s: tuning.Settings) -> float | None:
        """The accept length SGLang's counters gave s's latest reading with this draft."""
        found = [m for m in self.measured if m["draft"] == draft and m["settings"] == s and m["levels"]]
        return figures(found[-1]["levels"]).get(self.objective.at, {}).get("accept_length") if found else None

    def draft_label(self, draft: str) -> str:
        return f", draft {draft}" if len(self.drafts) > 1 else ""

    def plain(self, serve) -> list:
        """The target alone on the full load: the baseline, at the start and again at the end."""
        self.restarts += 1
        with serve(transient.plain_argv(self.run, self.svc)) as unit:
            self.pace.switched()
            levels = specbench.measure(self.run, self.svc, self.load, unit=unit)
            self.ran(levels, self.load)
            return levels

    def search(self, serve, now):
        self.run.say("starting the baseline (no speculation)")
        self.base = self.plain(serve)
        own = self.svc["speculative"].get("draft_model_path")
        for draft in self.drafts:
            self.draft = draft
            if len(self.drafts) > 1:
                self.run.say(f"draft {draft}")
            start = now if draft == own and now in self.space.candidates else climb.middle(self.space.candidates)
            self.climbs[draft], self.finals[draft] = climb.search(
                self.space.candidates, lambda s, d=draft: self.measure(serve, d, s, self.short, "short"),
                lambda s, d=draft: self.measure(serve, d, s, self.load, "full"), start, self.budget,
                lambda s, d=draft: self.accept_of(d, s), lambda n, d=draft: self.told.__setitem__(d, n))
        # the same target with the same load at the end: how far the box moved under the tune
        self.run.say("starting the baseline again (no speculation): how noisy were the figures?")
        try:
            self.base_again = self.plain(serve)
        except transient.GpusBusy:
            raise
        except SpecopsError as e:  # the candidates' figures stand; only their noise is unknown
            self.run.say(f"the baseline again: out: {str(e)[:200]}")

    def judged(self, draft: str) -> dict:
        """A draft's finalists, each with its measurement: the better full-load reading where they
        ran, else (the budget ran out before any) the short load's."""
        finals = self.finals.get(draft) or {}
        rung = "full" if finals else "short"
        keep = set(finals) or (set(climb.finalists(self.climbs[draft])) if draft in self.climbs else set())
        pick: dict = {}
        for m in self.measured:
            if m["draft"] == draft and m["rung"] == rung and m["settings"] in keep and m["score"] is not None:
                if m["settings"] not in pick or m["score"] > pick[m["settings"]]["score"]:
                    pick[m["settings"]] = m
        return pick
