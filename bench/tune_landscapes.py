"""How often spec-tune's search (specops/sglang/climb.py: the climb on the short load, then the
finalists on the full load) ends near the optimum, and what it spends, over many landscapes of the
simulator's performance model in closed form (sim_perf.steady_tok_s): accept rate, draft cost and
concurrency varied, two spaces, two starting points.  Pure: no fleet.

    .venv/bin/python bench/tune_landscapes.py [--noise [--seeds N]]

--noise: each reading is off by a few percent (sigma 3% on the short load, half that on the full
load, four times as many requests), and one start in ten is a slow one (0.35-0.6 of the truth for
its whole life: a neighbour on a shared box, a JIT compile), seeded per landscape, start and draw
(--seeds, default 5: the figure is a rate, so several draws of the noise per landscape).

Restarts counted as spec-tune spends them: the baseline, every candidate's start, a reading
measured again, the finalists' full loads, the baseline again at the end.
"""
import itertools
import random
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sandbox.oracle import sim_perf  # noqa: E402
from specops.sglang import climb, tuning  # noqa: E402


SVC = {"name": "s", "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d",
                                    "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}}
SPACES = {"EAGLE3 default": None,
          "the issue's": {"num_steps": [1, 2, 3, 5], "eagle_topk": [1, 2, 4, 8], "num_draft_tokens": [2, 4, 8, 16]}}
TARGET = climb.BUDGET_SHARE  # of the grid's restarts


def noisy(f, rng, jitter, slow=0.1):
    def read(s):
        v = f(s) * rng.gauss(1.0, jitter)
        return v * rng.uniform(0.35, 0.6) if rng.random() < slow else v
    return read


def search(f, space, start, rng, accept):
    """One tune as spec-tune runs it (climb.search within the default budget): the winner and
    the restarts it spent, both baselines included."""
    short = noisy(f, rng, 0.03) if rng else f
    full = noisy(f, rng, 0.015) if rng else f
    run, scores = climb.search(space.candidates, short, full, start, climb.default_budget(space), accept)
    return climb.winner_of(run, scores), 2 + len(run.scores) + len(run.again) + len(scores)


def main():
    noise = "--noise" in sys.argv
    seeds = int(sys.argv[sys.argv.index("--seeds") + 1]) if "--seeds" in sys.argv else 5
    rows = []
    for name, asked in SPACES.items():
        space = tuning.prune(SVC, tuning.asked_space(SVC, asked))
        for alpha, cost, c in itertools.product((0.5, 0.6, 0.7, 0.8, 0.9), (0.05, 0.1, 0.2, 0.3), (1, 4, 8, 32)):
            env = {"SGLANG_SIM_ACCEPT_RATE": str(alpha), "SGLANG_SIM_DRAFT_COST": str(cost)}
            f = lambda s: sim_perf.steady_tok_s(env, c, (s.num_steps, s.eagle_topk, s.num_draft_tokens))  # noqa: E731
            best = max(f(s) for s in space.candidates)
            # SGLang's counters give each reading's accept length; a slow start does not change it
            accept = lambda s: sim_perf.accept_length(  # noqa: E731
                alpha, 0.5, s.num_steps, s.eagle_topk, s.num_draft_tokens)
            for i, start in enumerate((tuning.Settings(3, 1, 4), climb.middle(space.candidates))):
                for seed in range(seeds if noise else 1):
                    rng = random.Random(zlib.crc32(repr((name, alpha, cost, c, i, seed)).encode())) if noise else None
                    winner, restarts = search(f, space, start, rng, accept)
                    rows.append((name, 1 - f(winner) / best, restarts, space.grid + 1, len(space.candidates) + 1))
    print(f"{len(rows)} tunes" + (f" with noise ({seeds} draws of it per landscape and start)" if noise else ""))
    for name in SPACES:
        mine = [r for r in rows if r[0] == name]
        near = sum(1 for r in mine if r[1] <= 0.03)
        both = sum(1 for r in mine if r[1] <= 0.03 and r[2] <= TARGET * r[3])
        print(f"{name} space ({mine[0][3] - 1} combinations, {mine[0][4] - 1} distinct settings): within 3% of the "
              f"optimum in {near} of {len(mine)} ({near / len(mine):.1%}), and at most {TARGET:.0%} of the grid's "
              f"restarts too in {both}; "
              f"restarts {sum(r[2] for r in mine) / len(mine):.1f} on average, "
              f"{max(r[2] for r in mine)} at most, against the grid's {mine[0][3]} "
              f"({sum(r[2] / r[3] for r in mine) / len(mine):.0%})")


if __name__ == "__main__":
    main()
