"""How long a bench or a tune still takes: the one estimator behind every "about N s left" that
spec-bench (flows/specbench.py) and spec-tune (flows/tuning.py, flows/tuning_search.py) say.

A plan is the steps still to come, each a load (its modeled seconds: specbench.level_seconds, its
waves each as long as the levels that ran on this run say a wave at its concurrency takes, on a
line through them: specbench.wave_seconds) or a switch (a restart: a GPU window's stop and a
transient unit's start, one transient unit for the next, or the service's restart and verify after
the window).  The flow owns the plan (it knows what comes next); this module owns the clock: as
each step ends the flow says so, and the Pace times it.  What is left is then read at this host's
pace on this run: loads at the ratio of wall to modeled seconds of the loads done, each done load
modeled on its own readings (so the ratio is what the host adds to the seconds its levels report,
warm-up waves and all; how waves grow with concurrency is the model's), the first readings setting
it; and switches as long as the switches measured so far (before any: the service's last start
from its journal at that ratio, plus STOP_S).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

# Before any switch is measured, one is the service's last start (its journal: the unit's start to
# the ready line) and what that line leaves out: the stop (SGLang's exit and its CUDA contexts let
# go, up to the 3 s `settle` the agent waits for them), nvidia-smi read before and after to prove
# the memory free, the ready endpoint polled, and after the window the service's verify.  A few
# seconds each on an idle box; 10 s in all.  Once one switch is measured its mean replaces this.
STOP_S = 10.0


def now() -> float:
    """The clock steps are timed by (tests put a made-up one here)."""
    return time.monotonic()


@dataclass(frozen=True)
class Step:
    switch: bool
    model: float = 0.0  # a load's modeled seconds


SWITCH = Step(True)


def load(model: float) -> Step:
    return Step(False, model)


class Pace:
    """What this run measured so far: each load (its model, its wall seconds) and each switch (its
    wall seconds); `start` the service's last start from its journal (None: not known).  Each step
    is timed from the end of the one before (or from `mark()`)."""

    def __init__(self, start: float | None = None, clock=None):
        self.start, self.clock = start, clock or now
        self.since = self.clock()
        self.loads: list[tuple[float, float]] = []
        self.switches: list[float] = []

    def mark(self) -> None:
        """What ran since is none of the plan's steps (a failed load, with no model to weigh it by)."""
        self.since = self.clock()

    def _took(self) -> float:
        t = self.clock()
        took, self.since = t - self.since, t
        return took

    def switched(self) -> None:
        """A switch ended now (a transient unit ready, or the service verified after the window)."""
        self.switches.append(self._took())

    def loaded(self, model: float) -> float:
        """A load ended now, its wall seconds; `model` its modeled seconds (0: none, and it does not
        weigh the rate)."""
        took = self._took()
        if model > 0:
            self.loads.append((model, took))
        return took

    def rate(self) -> float:
        """Wall seconds a modeled second of load takes here (1 before any load ends)."""
        model = sum(m for m, _ in self.loads)
        return sum(w for _, w in self.loads) / model if model else 1.0

    def switch(self) -> float | None:
        """What a switch still to come is expected to take (None: nothing to go by)."""
        if self.switches:
            return sum(self.switches) / len(self.switches)
        return None if self.start is None else self.start * self.rate() + STOP_S

    def left(self, plan: list[Step]) -> float | None:
        """The seconds `plan` is expected to take from now; None when it holds a switch of unknown
        length.  Its first step is under way since the last one ended (a unit's stop, say, before
        a candidate's line is said): that much of it is behind."""
        each, rate = self.switch(), self.rate()
        if each is None and any(s.switch for s in plan):
            return None
        steps = [each if s.switch else rate * s.model for s in plan]
        if steps:
            steps[0] = max(steps[0] - (self.clock() - self.since), 0.0)
        return sum(steps)

    def says(self, plan: list[Step]) -> str:
        """What is left, as the flows say it ("about 80 s left"; "" under a second)."""
        total = self.left(plan)
        if total is None:
            return (f"{about(self.rate() * sum(s.model for s in plan))} of load left, and "
                    f"{sum(s.switch for s in plan)} start(s) of unknown length")
        return f"{about(total)} left" if total >= 1 else ""


def about(seconds: float) -> str:
    """A time still to come, as spec-bench and spec-tune say it: "about 40 s", "about 4.4 min"."""
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.1f} min"
