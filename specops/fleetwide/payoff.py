"""Whether speculative decoding still pays on a service: its `watch:` (WATCH, the one place its
defaults are written; watch_of reads and checks it) and the one judgement of production against
what the service's release measured (payoff), which `inv status` makes on numbers
(flows/status.py) and the alerts write as PromQL (alerts.py, through Series), once there is
traffic enough to judge (enough_traffic):

- not paying: the release measured a speedup S over no speculation at accept length A
  (spec-bench with --baseline, or spec-tune); production now accepts a, so speculation gives an
  estimated S x a / A; under 1 + speedup_margin it costs more than it gives (below 1), or too
  nearly as much.  Without a measured speedup there is no estimate, and no such verdict;
- degraded: production accepts less than accept_fraction x A: the draft fits the traffic less
  well than when it was measured, and may still pay.  Where not paying holds, it is that verdict.
"""
from __future__ import annotations

from typing import NamedTuple

from .. import again
from ..errors import UsageError

# A service's `watch:` when it says nothing.
WATCH = {"accept_fraction": 0.7, "for": "10m", "min_verify_rate": 1.0, "speedup_margin": 0.0}


class Watch(NamedTuple):
    accept_fraction: float
    for_: str
    min_verify_rate: float
    speedup_margin: float


def watch_of(host, svc: dict) -> Watch:
    """A service's `watch:`, with WATCH's defaults."""
    w = {**WATCH, **(svc.get("watch") or {})}
    where = f"{host.name}: service {svc['name']!r}: watch"
    if not 0 < w["accept_fraction"] <= 1:
        raise UsageError(f"{where}.accept_fraction: give a fraction above 0, at most 1 (got {w['accept_fraction']})")
    if w["min_verify_rate"] < 0:
        raise UsageError(f"{where}.min_verify_rate: give verify calls per second, 0 or more")
    if w["speedup_margin"] < 0:
        raise UsageError(f"{where}.speedup_margin: give how far above 1 the estimated speedup must stay, 0 or more "
                         f"(got {w['speedup_margin']})")
    return Watch(float(w["accept_fraction"]), w["for"], float(w["min_verify_rate"]), float(w["speedup_margin"]))


def enough_traffic(w: Watch, verify_rate):
    """Whether production served enough to be judged: at least `watch.min_verify_rate` verify
    calls a second.  On a number, a boolean (`inv status`, which has one reading of the counter,
    gives its mean over the server's life); on a Series, the PromQL condition (the alerts give
    the rate over 5 minutes)."""
    if isinstance(verify_rate, Series):
        return f"{verify_rate.text} >= {w.min_verify_rate:g}"
    return verify_rate > 0 and verify_rate >= w.min_verify_rate


def estimate(accept, release_accept, speedup):
    """The speedup speculation gives now: the release's, scaled by how much of the accept length
    it measured production keeps."""
    return accept * speedup / release_accept


def payoff(w: Watch, accept, release_accept, speedup=None):
    """(not paying, degraded): on numbers, two booleans (not paying is None without a measured
    speedup); on Series, the two PromQL conditions (the first's value is the estimate, the
    second's production's accept length)."""
    not_paying = None if speedup is None else estimate(accept, release_accept, speedup) < 1 + w.speedup_margin
    return not_paying, accept < w.accept_fraction * release_accept


PRECEDENCE = {"<": 1, "*": 2, "/": 2}  # PromQL's, among the operators payoff uses


class Series:
    """A PromQL expression of one series per (host, service), written by the arithmetic payoff()
    does on numbers: two of them join on host and service, keeping the left one's labels (its
    `group` too), and an operand is bracketed where PromQL would otherwise bind it otherwise."""

    def __init__(self, text: str, precedence: int = 9):
        self.text, self.precedence = text, precedence

    def _side(self, op: str, right: bool) -> str:
        tighter = self.precedence > PRECEDENCE[op] or (not right and self.precedence == PRECEDENCE[op])
        return self.text if tighter else f"({self.text})"

    def _op(self, op: str, other, reflected: bool = False) -> Series:
        if isinstance(other, Series):
            return Series(f"{self._side(op, False)}\n{op} on(host, service) group_left()\n{other._side(op, True)}",
                          PRECEDENCE[op])
        left, right = (f"{other:g}", self._side(op, True)) if reflected else (self._side(op, False), f"{other:g}")
        return Series(f"{left} {op} {right}", PRECEDENCE[op])

    def __mul__(self, other):
        return self._op("*", other)

    def __rmul__(self, other):
        return self._op("*", other, reflected=True)

    def __truediv__(self, other):
        return self._op("/", other)

    def __lt__(self, other):
        return self._op("<", other)


def remedy(host: str) -> str:
    """What to run when a draft no longer pays, or pays less: a tune on the traffic that moved
    (a sample of what the service serves now, not the prompt file it was measured with)."""
    return again.command("spec-tune", "--traffic", host=host)
