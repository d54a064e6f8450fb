"""spec-tune's pure logic: the search space of a service's speculative settings, pruned with
SGLang's rules, the search over it, the objective, and what the figures say.

The space is a grid of asked values (`tune:` in the inventory, or the algorithm's default).  Each
asked combination is resolved as SGLang would run it (rules.resolve): an adjusted one stands for
what SGLang runs instead, so duplicates collapse; a refused one is dropped, as is a tree that
cannot fill its draft tokens (see TREE_POOL).  What is left are `Settings`, each measured at
most once per load.

The search spends restarts, not load: it starts from what the service runs now (or the middle
of the space) and measures its neighbours with a short load (every candidate near it on each
knob, diagonals included: the knobs are coupled), moves to the first that beats where it stands,
and stops when none does.  Throughput mostly rises and then falls along these moves (more steps,
a wider tree or more draft tokens each buy accepted tokens with per-step cost), so the climb
usually ends at the optimum without the grid; it can end on a local one (BENCHMARKS.md says how
often, over the simulator's formula).  The finalists (those within FINALIST_MARGIN of the best
short figure) then get the full load: the second rung of a successive halving, which only the
candidates that can still win reach.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

from ..errors import UsageError
from .rules import EAGLE_FAMILY, resolve

KNOBS = ("num_steps", "eagle_topk", "num_draft_tokens")
# A default space per algorithm family (NEXTN, DeepSeek's MTP head, is EAGLE to SGLang):
# SGLang's own scripts/playground/bench_speculative.py sweeps steps 1-7, topk 1-8, 2-32 tokens.
DEFAULT_SPACES = {
    "EAGLE": {"num_steps": [1, 3, 5, 7], "eagle_topk": [1, 2, 4, 8], "num_draft_tokens": [2, 4, 8, 16, 32]},
    "EAGLE3": {"num_steps": [1, 3, 5, 7], "eagle_topk": [1, 2, 4, 8], "num_draft_tokens": [2, 4, 8, 16, 32]},
    "NEXTN": {"num_steps": [1, 2, 3, 4], "eagle_topk": [1, 2, 4], "num_draft_tokens": [2, 4, 8]},
    # a whole model drafts: every step costs, so chains and narrow trees
    "STANDALONE": {"num_steps": [1, 2, 3, 4, 5], "eagle_topk": [1, 2], "num_draft_tokens": [2, 4, 8]},
    # DFLASH runs one step and topk 1 (SGLang forces both): only the block of draft tokens varies
    "DFLASH": {"num_draft_tokens": [4, 8, 16, 32]},
}
# SGLang's EAGLE tree (srt/speculative, build_tree_kernel_efficient_preprocess) picks
# num_draft_tokens - 1 nodes with torch.topk over the draft's scores: topk from the root and
# topk * topk at each further step.  Asking for more fails at the first verify, not at start.
TREE_POOL = "a tree of num_steps {s} and topk {k} has {n} candidate nodes, fewer than num_draft_tokens - 1 = {d}"
FINALIST_MARGIN = 0.08  # within 8% of the best short figure: noise on a shared box can be that much
MOVE_MARGIN = 0.01      # the climb moves only for a gain above this
SIDEWAYS = 1            # moves to an equal neighbour (a plateau) the climb may make when it would stop
LEVEL = 0.07            # a neighbour within this of where the climb stands is level with it (noise on a short load)
KEEP_MARGIN = 0.03      # a winner must beat what the service runs now by this much to replace it
# A reading under this fraction of its best measured neighbour's is measured again before it counts
# (the better of the two stands): settings one step apart do not differ that much, a slow reading
# (a neighbour on a shared box, a compile after a start) does.
OUTLIER = 0.7
RIDGE = 1e-3           # keeps the plane's fit solvable while a knob has one value measured
USE_ACCEPT = True
EXPLORE = 4             # restarts a climb started again leaves to finalists, beyond search()'s two
FINALISTS = 6          # at most, within FINALIST_MARGIN, as the budget allows (three at least)
BUDGET_SHARE = 0.4      # of the grid's restarts: what a search may spend by default (bench/tune_landscapes.py)
MIN_BUDGET = 12
MIN_ASKED_BUDGET = 4
BUDGET_PARTS = "(the baseline, the baseline again at the end, a candidate and its full load)"
FLAT_ACCEPT = 0.5       # accepted tokens gained across at least twice the draft tokens, below which
FLAT_DRAFT_RATIO = 2    # the draft's own acceptance is the limit


@dataclass(frozen=True, order=True)
class Settings:
    """The speculative settings SGLang runs with (after its own adjustments)."""
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int

    @classmethod
    def of(cls, effective: dict) -> "Settings":
        """What runs, from resolve()'s effective arguments."""
        return cls(effective["speculative_num_steps"], effective["speculative_eagle_topk"],
                   effective["speculative_num_draft_tokens"])

    def spec(self) -> dict:
        return {k: getattr(self, k) for k in KNOBS}

    def label(self) -> str:
        return f"steps {self.num_steps}, topk {self.eagle_topk}, draft tokens {self.num_draft_tokens}"


@dataclass
class Pruned:
    """An asked combination not measured as such: `runs_as` the settings SGLang would run
    instead (measured under that name, when kept), or None when it cannot run at all."""
    asked: dict
    reason: str
    runs_as: Settings | None = None
    rule: str = "duplicate"  # rules.RULES's key, "tree-pool", or "duplicate"


@dataclass
class Space:
    candidates: list[Settings]
    pruned: list[Pruned]
    grid: int  # asked combinations: the restarts a full sweep needs (one per combination)

    def summary(self) -> str:
        adjusted = sum(1 for p in self.pruned if p.runs_as)
        refused = len(self.pruned) - adjusted
        return (f"{self.grid} combinations asked; {len(self.candidates)} distinct settings to search "
                f"({adjusted} that SGLang would run as another, {refused} it would refuse or that cannot run)")


def asked_space(svc: dict, space: dict | None) -> dict:
    """The grid to search: the service's `tune` knobs over the algorithm's default space."""
    algo = svc["speculative"]["algorithm"].upper()
    if algo not in DEFAULT_SPACES:
        raise UsageError(f"{svc['name']}: spec-tune searches draft-model settings "
                         f"({', '.join(DEFAULT_SPACES)}); {algo} has none to search")
    grid = dict(DEFAULT_SPACES[algo])
    for knob, values in (space or {}).items():
        if knob == "budget":
            if not isinstance(values, int) or values < MIN_ASKED_BUDGET:  # true and false are 1 and 0: refused too
                raise UsageError(f"{svc['name']}: tune.budget must be a whole number of restarts, "
                                 f"{MIN_ASKED_BUDGET} or more {BUDGET_PARTS}")
            continue
        if knob == "drafts":  # checked where the host is known (flows/tuning.py drafts_of)
            continue
        if knob not in KNOBS:
            raise UsageError(f"{svc['name']}: tune.{knob}: not a knob spec-tune searches ({', '.join(KNOBS)})")
        if not isinstance(values, list) or not values or not all(isinstance(v, int) and v > 0 for v in values):
            raise UsageError(f"{svc['name']}: tune.{knob} must be a list of positive integers")
        grid[knob] = sorted(set(values))
    return grid


def prune(svc: dict, grid: dict) -> Space:
    """Each asked combination resolved as SGLang would run it; duplicates collapse."""
    spec = {k: v for k, v in svc["speculative"].items() if k not in KNOBS}
    keys = [k for k in KNOBS if k in grid]
    seen: dict[Settings, dict] = {}
    pruned = []
    combos = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
    for asked in combos:
        ask = speculative_for(svc["speculative"], asked)
        res = resolve(ask, page_size=svc.get("page_size"), attention_backend=svc.get("attention_backend"),
                      max_running_requests=svc.get("max_running_requests"))
        if res.errors:
            pruned.append(Pruned(asked, res.errors[0].message(), rule=res.errors[0].rule))
            continue
        eff = res.effective
        runs = Settings.of(eff)
        pool = runs.eagle_topk + (runs.num_steps - 1) * runs.eagle_topk ** 2
        if eff["speculative_algorithm"] in EAGLE_FAMILY and runs.num_draft_tokens - 1 > pool:
            pruned.append(Pruned(asked, TREE_POOL.format(s=runs.num_steps, k=runs.eagle_topk, n=pool,
                                                         d=runs.num_draft_tokens - 1), rule="tree-pool"))
            continue
        if res.adjustments or runs in seen:
            why = "; ".join(f.message() for f in res.adjustments) or "the same settings as another combination"
            pruned.append(Pruned(asked, why, runs, res.adjustments[0].rule if res.adjustments else "duplicate"))
        seen.setdefault(runs, asked)
    return Space(sorted(seen), pruned, len(combos))


def speculative_for(spec: dict, values: dict) -> dict:
    """The service's `speculative` mapping with these knob values: what a candidate runs with and
    what --apply writes (DFLASH's block size follows its draft tokens: SGLang wants them equal)."""
    out = dict(spec, **values)
    if out["algorithm"].upper() == "DFLASH" and out.get("dflash_block_size") is not None \
            and "num_draft_tokens" in values:
        out["dflash_block_size"] = values["num_draft_tokens"]
    return out


def neighbours(x: Settings, candidates: list[Settings], reach: int = 1) -> list[Settings]:
    """Every candidate near `x` on each knob: within `reach` values either way, or within a factor
    of 2^reach (the climb uses 1).  The knobs are coupled (a deeper or wider tree needs the draft tokens to fill it),
    so a step along one alone can stall where a step along two pays; and ratios count beside list
    positions because a chain's draft tokens (steps + 1) fall between the values asked for trees."""
    values = {k: sorted({getattr(c, k) for c in candidates}) for k in KNOBS}

    def near(c, k):
        a, b = getattr(c, k), getattr(x, k)
        return max(a, b) <= 2 ** reach * min(a, b) or abs(values[k].index(a) - values[k].index(b)) <= reach
    return [c for c in candidates if c != x and all(near(c, k) for k in KNOBS)]


def _toward(x: Settings, last: Settings | None, c: Settings) -> tuple:
    """Order to try neighbours in: along the last move first (a pattern move), then the nearest."""
    move = [0 if last is None else (getattr(x, k) > getattr(last, k)) - (getattr(x, k) < getattr(last, k)) for k in KNOBS]
    way = [(getattr(c, k) > getattr(x, k)) - (getattr(c, k) < getattr(x, k)) for k in KNOBS]
    agree = sum(1 for m, w in zip(move, way) if m and m == w) - sum(1 for m, w in zip(move, way) if m and w == -m)
    return (-agree, sum(1 for w in way if w), c)


def _plane(scores: dict):
    """A guess of unmeasured settings' figures, to try the likeliest neighbour first: the log of
    the figure as a plane in the knobs' logs, fitted by least squares to every reading so far
    (None: fewer than five).  Crude, and only an order: every neighbour is still measured before
    the climb stops."""
    pts = [(s, math.log(v)) for s, v in scores.items() if v]
    if len(pts) < 5:
        return None
    feats = lambda s: [1.0] + [math.log(getattr(s, k)) for k in KNOBS]  # noqa: E731
    n = len(KNOBS) + 1
    # the normal equations, a small ridge (a knob not varied yet), solved by elimination
    a = [[sum(feats(s)[i] * feats(s)[j] for s, _ in pts) + RIDGE * (i == j > 0) for j in range(n)] for i in range(n)]
    b = [sum(feats(s)[i] * y for s, y in pts) for i in range(n)]
    for i in range(n):
        p = max(range(i, n), key=lambda r: abs(a[r][i]))
        a[i], a[p], b[i], b[p] = a[p], a[i], b[p], b[i]
        for r in range(i + 1, n):
            m = a[r][i] / a[i][i]
            a[r] = [x - m * y for x, y in zip(a[r], a[i])]
            b[r] -= m * b[i]
    w = [0.0] * n
    for i in reversed(range(n)):
        w[i] = (b[i] - sum(a[i][c] * w[c] for c in range(i + 1, n))) / a[i][i]
    return lambda s: sum(x * y for x, y in zip(w, feats(s)))


def middle(candidates: list[Settings]) -> Settings:
    """Where a search starts when the service's own settings are not in the space."""
    values = {k: sorted({getattr(c, k) for c in candidates}) for k in KNOBS}
    mid = {k: v[(len(v) - 1) // 2] for k, v in values.items()}
    return min(candidates, key=lambda c: (sum(abs(values[k].index(getattr(c, k)) - values[k].index(mid[k]))
                                              for k in KNOBS), c))


@dataclass
class Objective:
    """What a candidate is judged by: output tok/s at concurrency `at` (default), or the mean
    speedup over the load's levels (`mean`); candidates whose p99 inter-token latency exceeds
    `max_itl_p99` seconds are out; a winner must beat the baseline by `min_speedup`."""
    at: int
    mean: bool = False
    max_itl_p99: float | None = None
    min_speedup: float = 1.0

    def levels(self, load_levels: list[int]) -> list[int]:
        """The levels a short load needs to judge a candidate."""
        return list(load_levels) if self.mean else [self.at]

    def speedup(self, figures: dict, base: dict) -> float | None:
        """figures, base: concurrency → a level's figures."""
        gains = [figures[c]["output_tok_s"] / base[c]["output_tok_s"] for c in figures
                 if c in base and base[c].get("output_tok_s")]
        if self.mean:
            return sum(gains) / len(gains) if gains else None
        b = base.get(self.at, {}).get("output_tok_s")
        return figures[self.at]["output_tok_s"] / b if b and self.at in figures else None

    def score(self, figures: dict, base: dict) -> tuple[float | None, str]:
        """(the figure to maximise, or None with why it is out)."""
        if any(f.get("failed") for f in figures.values()):
            return None, "requests failed"
        if self.max_itl_p99 is not None:
            over = [c for c, f in figures.items() if (f.get("itl_p99") or 0) > self.max_itl_p99]
            if over:
                return None, (f"p99 inter-token latency {figures[over[0]]['itl_p99'] * 1000:.1f} ms at concurrency "
                              f"{over[0]} is above {self.max_itl_p99 * 1000:.1f} ms")
        if self.mean:
            gain = self.speedup(figures, base)
            return gain, "" if gain is not None else "no baseline to compare with"
        return (figures[self.at]["output_tok_s"], "") if self.at in figures else (None, f"concurrency {self.at} not measured")

    def describe(self) -> str:
        what = "the mean speedup over the load's levels" if self.mean else f"output tok/s at concurrency {self.at}"
        bound = f", p99 inter-token latency at most {self.max_itl_p99 * 1000:.0f} ms" if self.max_itl_p99 else ""
        return f"{what}{bound}; it must beat serving without speculation by {self.min_speedup}x"


@dataclass
class Climb:
    """The short-load rung: each measured candidate's score (None: infeasible or failed)."""
    scores: dict = field(default_factory=dict)
    path: list = field(default_factory=list)
    again: list = field(default_factory=list)  # settings measured again: [settings, first reading, second]
    budget_spent: bool = False

    def best(self) -> Settings | None:
        ok = [c for c, s in self.scores.items() if s is not None]
        return max(ok, key=lambda c: (self.scores[c], -c.num_draft_tokens)) if ok else None


def climb(candidates: list[Settings], measure: Callable[[Settings], float | None], start: Settings,
          budget: int, out: Climb | None = None, accept: Callable = lambda s: None) -> Climb:
    """Hill-climb with `measure` (one restart each; at most `budget`, counting the readings `out`
    holds already when it goes on from an earlier climb's).  `accept(s)`: the accept length s was
    measured with (None: not known)."""
    out = out or Climb()
    spent = len(out.scores) + len(out.again)

    def expected(c, n):
        """What neighbour n's reading says c should read: as much, or less in proportion when c's
        draft got fewer tokens accepted a step (a slow start slows every step; it does not change
        what the draft gets accepted, so a setting worse for its acceptance is no outlier)."""
        a, b = accept(c), accept(n)
        return out.scores[n] * (min(1.0, a / b) if a and b and USE_ACCEPT else 1.0)

    def probe(c):
        nonlocal spent
        if c in out.scores:
            return
        if spent >= budget:
            out.budget_spent = True
            return
        spent += 1
        out.scores[c] = measure(c)
        for s in [c] + neighbours(c, candidates):  # c may be the slow one, or show a neighbour was
            suspect(s)

    def suspect(c):
        """Measure c again, once, when it reads under OUTLIER of its best measured neighbour."""
        nonlocal spent
        near = [expected(c, n) for n in neighbours(c, candidates) if out.scores.get(n) is not None]
        if out.scores.get(c) is None or not near or out.scores[c] >= OUTLIER * max(near) \
                or any(a[0] == c for a in out.again) or spent >= budget:
            return
        spent += 1
        second = measure(c)
        out.again.append([c, out.scores[c], second])
        out.scores[c] = max(out.scores[c], second if second is not None else out.scores[c])

    x, last, sideways = start, None, 0
    probe(x)
    out.path.append(x)
    while True:  # first improvement: move on as soon as a neighbour beats where the climb stands
        here = out.scores.get(x)
        todo = [n for n in neighbours(x, candidates) if n not in out.scores]
        while todo and not out.budget_spent:
            guess = _plane(out.scores)  # refitted after every reading
            todo.sort(key=lambda c: ((-guess(c),) if guess else ()) + _toward(x, last, c))
            n = todo.pop(0)
            probe(n)
            if out.scores.get(n) is not None and (here is None or out.scores[n] > here * (1 + MOVE_MARGIN)):
                break
        best = out.best()
        if best is None or best == x or (here is not None and out.scores[best] <= here * (1 + MOVE_MARGIN)):
            # a plateau: a neighbour as good (within noise) that has not been stood on may lead on
            level = [c for c in neighbours(x, candidates) if out.scores.get(c) is not None and here is not None
                     and out.scores[c] >= here * (1 - LEVEL) and c not in out.path]
            if not level or sideways == SIDEWAYS or out.budget_spent:
                return out
            best, sideways = max(level, key=lambda c: out.scores[c]), sideways + 1
        x, last = best, x
        out.path.append(x)


def default_budget(space: Space) -> int:
    """Restarts one draft's search may spend, both baselines included: BUDGET_SHARE of the grid's,
    but at least MIN_BUDGET (a small grid still needs a climb), and no more than every distinct
    setting once with the four restarts search() keeps (two baselines, two finalists)."""
    return min(max(int(BUDGET_SHARE * (space.grid + 1)), MIN_BUDGET), len(space.candidates) + 4)


def search(candidates: list[Settings], short: Callable, full: Callable, start: Settings,
           budget: int, accept: Callable = lambda s: None) -> tuple[Climb, dict]:
    """The two rungs within `budget` restarts (two of them the baselines, which the caller runs):
    the climb on the short load, leaving two for finalists, then the finalists on the full load.
    The climb and the finalists' full-load scores."""
    rung = max(budget - 4, 1)
    c = climb(candidates, short, start, rung, accept=accept)
    while not c.budget_spent and len(c.scores) + len(c.again) < rung - EXPLORE:
        # the climb stopped with restarts left: climb again from the likeliest setting not measured
        # (a space whose values are far apart can hide the optimum behind a worse neighbour)
        rest = [s for s in candidates if s not in c.scores]
        if not rest:
            break
        guess = _plane(c.scores)
        c = climb(candidates, short, max(rest, key=lambda s: (guess(s) if guess else 0, s)), rung, c, accept)
    return c, final(c, full, budget - 2 - len(c.scores) - len(c.again))


def winner_of(c: Climb, scores: dict) -> Settings | None:
    """The best full-load score; the best short one when no finalist got the full load."""
    ok = [s for s, v in scores.items() if v is not None]
    return max(ok, key=lambda s: (scores[s], -s.num_draft_tokens)) if ok else (None if scores else c.best())


def finalists(c: Climb, most: int = 3) -> list[Settings]:
    """Those the full load decides between: within FINALIST_MARGIN of the best short figure."""
    best = c.best()
    if best is None:
        return []
    top = c.scores[best]
    near = [s for s, v in c.scores.items() if v is not None and v >= top * (1 - FINALIST_MARGIN)]
    return sorted(near, key=lambda s: -c.scores[s])[:most]


def final(c: Climb, measure: Callable[[Settings], float | None], budget: int) -> dict:
    """The second rung: each finalist on the full load, at most `budget` restarts; the scores.  A
    full reading under OUTLIER of the same settings' short one is a slow start, not the settings:
    it is measured again and the better stands (noted in c.again)."""
    out: dict = {}
    for s in finalists(c, max(3, min(budget, FINALISTS))):
        if budget <= 0:
            c.budget_spent = True
            break
        budget -= 1
        out[s] = measure(s)
        if out[s] is not None and out[s] < OUTLIER * c.scores[s] and budget > 0:
            budget -= 1
            second = measure(s)
            c.again.append([s, out[s], second])
            out[s] = max(out[s], second if second is not None else out[s])
    return out


def draft_limit(accepts: dict) -> str | None:
    """`accepts`: settings → accept length measured.  When the accept length hardly moves across
    all the settings measured (less than FLAT_ACCEPT tokens from the lowest to the highest) while
    their draft tokens span at least FLAT_DRAFT_RATIO times, the draft's own acceptance is the
    limit, not the settings: a working draft gains tokens as it is given more to propose."""
    seen = {s: a for s, a in accepts.items() if a}
    if len(seen) < 2:
        return None
    fewest = min(s.num_draft_tokens for s in seen)
    most = max(s.num_draft_tokens for s in seen)
    low, high = min(seen.values()), max(seen.values())
    if most < FLAT_DRAFT_RATIO * fewest or high - low >= FLAT_ACCEPT:
        return None
    return (f"the accept length barely moves with the settings ({low:.2f} to {high:.2f} tokens a step, with "
            f"{fewest} to {most} draft tokens): the draft's own acceptance is the limit, not the settings.  Check "
            f"the draft config lint (inv deploy --check: the draft's hidden-state layers against the target), "
            f"the embedding-capture patch on the target, and what the draft was trained on (this target's "
            f"hidden states?)")
