"""spec-tune's search over a space of Settings (tuning.py makes the space): it spends restarts, not
load, and each reading may be noisy.

It starts from what the service runs now (or the middle of the space) and measures neighbours with
a short load (every candidate near it on each knob, diagonals included: the knobs are coupled), the
one a plane fitted to every reading so far guesses best first, moves to the first that beats where
it stands, and stops when none does (stepping once onto a level neighbour first). Throughput mostly
rises and then falls along these moves (more steps, a wider tree or more draft tokens each buy
accepted tokens with per-step cost), so the climb usually ends at the optimum without the grid.
When it stops with restarts to spare it climbs again from the likeliest setting not measured (a
space whose values are far apart can hide the optimum behind a worse neighbour), and in a small
space measures all that is left when its restarts hold it. A reading far below what a neighbour
predicts for it (the neighbour's figure, scaled by their accept lengths) is a slow start, not the
settings: it is measured again before it can drop a candidate, with a restart taken from the final
rung if the climb's are spent. The finalists (those within FINALIST_MARGIN of the best short
figure) then get the full load: the second rung of a successive halving, which only the candidates
that can still win reach. bench/tune_landscapes.py says how often this ends within 3% of the
optimum, with and without noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .tuning import KNOBS, Settings, Space

FINALIST_MARGIN = 0.08  # within 8% of the best short figure: noise on a shared box can be that much
MOVE_MARGIN = 0.01      # the climb moves only for a gain above this
SIDEWAYS = 1            # moves to an equal neighbour (a plateau) the climb may make when it would stop
LEVEL = 0.07            # a neighbour within this of where the climb stands is level with it (noise on a short load)
# A reading under this fraction of its best measured neighbour's is measured again before it counts
# (the better of the two stands): settings one step apart do not differ that much, a slow reading
# (a neighbour on a shared box, a compile after a start) does.
OUTLIER = 0.7
RIDGE = 1e-3           # keeps the plane's fit solvable while a knob has one value measured
USE_ACCEPT = True
EXPLORE = 8             # restarts a climb started again leaves to finalists, beyond search()'s two
FINALISTS = 6          # at most, within FINALIST_MARGIN, as the budget allows (three at least)
BUDGET_SHARE = 0.4      # of the grid's restarts: what a search may spend by default (bench/tune_landscapes.py)
MIN_BUDGET = 12
# A slow reading found when the climb's restarts are spent may still be measured again, with this
# many taken from the final rung: a lost optimum costs more than one finalist's full load less.
LEND = 1
# Restarts the climb leaves to the finalists' full loads: a sixth of the budget, 2 to 4.  Short
# readings 3% apart are noise on a shared box: the full load must see the top few, not the top two
# (bench/tune_landscapes.py --noise: 93.6% -> 96.1% within 3% on the space at 2 -> 4).
RESERVE = 4


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
    move = [
        0 if last is None else (getattr(x, k) > getattr(last, k)) - (getattr(x, k) < getattr(last, k)) for k in KNOBS
    ]
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
                or any(a[0] == c for a in out.again) or spent >= budget + LEND:
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
    setting once with four restarts more (two baselines, two finalists at least)."""
    return min(max(int(BUDGET_SHARE * space.grid_restarts()), MIN_BUDGET), len(space.candidates) + 4)


def rungs(budget: int) -> tuple[int, int]:
    """Of `budget` restarts (two of them the baselines): at most how many the climb spends on the
    short load, and how many it leaves to the finalists' full load (more when it stops early)."""
    rung = max(budget - 2 - max(2, min(RESERVE, budget // 6)), 1)
    return rung, max(budget - 2 - rung, 0)


def search(candidates: list[Settings], short: Callable, full: Callable, start: Settings,
           budget: int, accept: Callable = lambda s: None, told: Callable = lambda n: None) -> tuple[Climb, dict]:
    """The two rungs within `budget` restarts (two of them the baselines, which the caller runs):
    the climb on the short load, leaving some for finalists, then the finalists on the full load.
    The climb and the finalists' full-load scores; `told(n)` hears how many full loads the
    finalists get, once the climb has ended."""
    rung = rungs(budget)[0]
    c = climb(candidates, short, start, rung, accept=accept)
    while not c.budget_spent:
        # the climb stopped with restarts left: climb again from the likeliest setting not measured
        # (a space whose values are far apart can hide the optimum behind a worse neighbour), and
        # in a small space measure what is left when the restarts left hold it all
        rest, left = [s for s in candidates if s not in c.scores], rung - len(c.scores) - len(c.again)
        if not rest or (left <= EXPLORE and len(rest) > left):
            break
        guess = _plane(c.scores)
        c = climb(candidates, short, max(rest, key=lambda s: (guess(s) if guess else 0, s)), rung, c, accept)
    return c, final(c, full, budget - 2 - len(c.scores) - len(c.again), told)


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


def final(c: Climb, measure: Callable[[Settings], float | None], budget: int,
          told: Callable = lambda n: None) -> dict:
    """The second rung: each finalist on the full load, at most `budget` restarts; the scores (and
    `told` how many it measures, a slow one's second reading aside).  A full reading under OUTLIER
    of the same settings' short one is a slow start, not the settings: it is measured again and the
    better stands (noted in c.again)."""
    out: dict = {}
    chosen = finalists(c, max(3, min(budget, FINALISTS)))
    told(max(min(len(chosen), budget), 0))
    for s in chosen:
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
