"""spec-tune's pure logic: the search space of a service's speculative settings, pruned with
SGLang's rules, the objective, and what the figures say (the search over the space is climb.py's).

The space is a grid of asked values (`tune:` in the inventory, or the algorithm's default).  Each
asked combination is resolved as SGLang would run it (rules.resolve): an adjusted one stands for
what SGLang runs instead, so duplicates collapse; a refused one is dropped, as is a tree that
cannot fill its draft tokens (see TREE_POOL).  What is left are `Settings`, each measured at
most once per load.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .. import again
from ..errors import UsageError
from .rules import EAGLE_FAMILY, resolve, tree_nodes

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
# A tree that cannot fill its draft tokens (rules.tree_nodes)
TREE_POOL = "a tree of num_steps {s} and topk {k} has {n} candidate nodes, fewer than num_draft_tokens - 1 = {d}"
KEEP_MARGIN = 0.03      # a winner must beat what the service runs now by this much to replace it
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
    kept: bool = False  # the first asked for what it runs as: measured (a distinct setting), not pruned


@dataclass
class Space:
    candidates: list[Settings]
    pruned: list[Pruned]
    grid: int  # asked combinations: a full sweep restarts once per combination (and per draft)

    def summary(self) -> str:
        """The asked combinations, each counted once: distinct settings, the same settings again
        (as asked, or as SGLang would run them), refused; the three add up to the grid."""
        refused = sum(1 for p in self.pruned if not p.runs_as)
        again = self.grid - len(self.candidates) - refused
        return (f"{self.grid} combinations asked: {len(self.candidates)} distinct settings to search, {again} "
                f"that SGLang would run as one of those, {refused} it would refuse or that cannot run")

    def grid_restarts(self, drafts: int = 1) -> int:
        """The restarts a full sweep needs: every combination with every draft, and the baseline."""
        return self.grid * drafts + 1

    def grid_words(self, drafts: int = 1) -> str:
        """"81 restarts (80 combinations + the baseline)": the sweep a search is set against."""
        per = f"{self.grid} combinations" + (f" × {drafts} drafts" if drafts > 1 else "")
        return f"{self.grid_restarts(drafts)} restarts ({per} + the baseline)"


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
        if knob in ("drafts", "traffic"):  # checked where the host is known (flows/tuning.py, flows/traffic.py)
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
        pool = tree_nodes(runs.num_steps, runs.eagle_topk)
        if eff["speculative_algorithm"] in EAGLE_FAMILY and runs.num_draft_tokens - 1 > pool:
            pruned.append(Pruned(asked, TREE_POOL.format(s=runs.num_steps, k=runs.eagle_topk, n=pool,
                                                         d=runs.num_draft_tokens - 1), rule="tree-pool"))
            continue
        if res.adjustments or runs in seen:
            why = "; ".join(f.message() for f in res.adjustments) or "the same settings as another combination"
            pruned.append(Pruned(asked, why, runs, res.adjustments[0].rule if res.adjustments else "duplicate",
                                 kept=runs not in seen))
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
        return (
            (figures[self.at]["output_tok_s"], "")
            if self.at in figures
            else (None, f"concurrency {self.at} not measured")
        )

    def describe(self) -> str:
        what = "the mean speedup over the load's levels" if self.mean else f"output tok/s at concurrency {self.at}"
        bound = f", p99 inter-token latency at most {self.max_itl_p99 * 1000:.0f} ms" if self.max_itl_p99 else ""
        return f"{what}{bound}; it must {self.bar()}"

    def bar(self) -> str:
        """What a winner must do, in words: "serve faster than without speculation" (a min_speedup
        of 1), else "serve at least 1.1x as fast as without speculation"."""
        if self.min_speedup == 1:
            return "serve faster than without speculation"
        return f"serve at least {self.min_speedup:g}x as fast as without speculation"


def draft_limit(accepts: dict, host: str) -> str | None:
    """`accepts`: settings → accept length measured on `host`.  When the accept length hardly moves
    across all the settings measured (less than FLAT_ACCEPT tokens from the lowest to the highest)
    while their draft tokens span at least FLAT_DRAFT_RATIO times, the draft's own acceptance is the
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
            f"the draft config lint (`{again.command('deploy', '--check', host=host)}`: the draft's hidden-state "
            f"layers against the target), the embedding-capture patch on the target, and what the draft was "
            f"trained on (this target's hidden states?)")
