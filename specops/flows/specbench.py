"""spec-bench, the controller's side: does speculative decoding pay off on this host?

The load runs on the host (agent/bench/specbench.py); this module asks for it, runs the baseline in a
GPU window (the same target, the same arguments minus the speculative ones, as a transient unit:
agent/bench/baseline.py), always restores the service, turns the two measurements into speedups and a
plain verdict, and keeps the result with the current release (perf.json).  Each level is its own
request, said as it ends with its figures and, for a bench's own load, about how long is left.
"""
from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from . import pace as pace_mod, traffic, transient
from .. import kinds, protocol
from ..prompts import read as read_prompts
from ..remote import shipping
from ..errors import SpecopsError, UsageError
from ..output.report import accept_text
from ..kinds.sglang import READY_LINE


@dataclass
class Load:
    """What spec-bench sends: the levels of concurrency, requests per level, tokens per request."""
    concurrency: list = field(default_factory=lambda: [1, 8, 32])
    requests: int = 64
    warmup: int = 4
    max_new_tokens: int = 128
    seed: int = 0
    prompts: str | None = None  # a prompt file (specops/prompts.py; default: files/prompts.json)
    sample: protocol.TrafficSample | None = None  # a traffic sample on the host, in place of the file

    def identity(self) -> dict:
        """What two results must share to be compared: the load, and the prompt set (its name,
        digest, and the prompts in it and sent), or the traffic sample's (never its prompts)."""
        load = {k: v for k, v in vars(self).items() if k not in ("prompts", "sample")}
        if self.sample:
            return {**load, **traffic.identity(self.sample), "prompts_sent": min(self.requests, self.sample.requests)}
        found = read_prompts(self.prompts)
        return {**load, **found.identity(len(found.sample(self.requests, self.seed)))}

    def prompt_list(self) -> list:
        """The prompts to send (each a string or {"messages": [...]}): the file's, sampled down to
        the requests of a level by the seed when it holds more; none with a traffic sample (the
        host picks from it by the same rule)."""
        return [] if self.sample else read_prompts(self.prompts).sample(self.requests, self.seed)

    def on_host(self) -> dict:
        """SpecBench's fields for a traffic sample."""
        return {"sample": self.sample.path, "sample_sha256": self.sample.sha256} if self.sample else {}


def service_of(host, name: str | None) -> dict:
    """The one service to measure: --service, or the host's only one."""
    svcs = [s for _, s in kinds.of_host(host)]
    chosen = [s for s in svcs if s["name"] == name] if name else svcs
    if len(chosen) != 1:
        raise SpecopsError(f"{host.name}: give --service (one of: {', '.join(s['name'] for s in svcs) or 'none'})"
                           if not name or not chosen else f"{host.name}: no service {name!r}")
    return chosen[0]


def refuse_router_baseline(hosts, name: str | None) -> None:
    """Before connecting: a baseline of a router would stop it (every client's outage) and measure
    its 503; a router has no speculation to compare."""
    for h in hosts:
        svcs = [s for _, s in kinds.of_host(h) if not name or s["name"] == name]
        routers = [s["name"] for s in svcs if kinds.kind_of(s).name == "router"]
        if routers and len(svcs) == 1:
            raise UsageError(f"{h.name}: {routers[0]} is a router: --baseline measures an SGLang server without "
                             f"speculation (give --service, or measure its workers' hosts)")


def last_start(run, svc: dict) -> float | None:
    """Seconds the service's own last start took, from its journal (the unit's start to its ready
    line; None: not in its journal): what the Pace counts a switch as until one is measured."""
    return run.call(protocol.Startup(unit=kinds.kind_of(svc).unit(svc).name, ready_line=READY_LINE)).seconds


@dataclass
class Ahead:
    """A bench's own measurement, said level by level with the time left: `what` it measures, the
    run's Pace, and `after(levels)`, the steps past this load (from its readings so far)."""
    what: str
    pace: pace_mod.Pace
    after: Callable[[list], list] = lambda levels: []


# With one reading a wave's growth is a guess: its fixed part (the weights read each step, whatever
# the batch) taken as worth this many requests' parts.  The simulator's EAGLE service has 11 to 15
# (sim_perf.py's defaults, fitted from concurrency 1 to 32 and to 8), its target alone 32: a host
# whose waves grow less (a target alone, say) is said too much time left until a second level ends.
FIXED_REQUESTS = 16


def wave_seconds(levels: list, concurrency: int, requests: int) -> float:
    """Seconds a wave of `concurrency` requests takes, from `levels` that ran on this run (each
    level's seconds over its waves, of its own requests or else `requests`; the latest reading at
    a concurrency): a level's own where one ran at it.  Else a wave grows along a line in the
    concurrency, as a GPU's step is a fixed part and a part per request in its batch: the line
    through the readings at the two nearest concurrencies (level, not falling, if the busier of
    them was the quicker), or with one reading a wave as long as FIXED_REQUESTS + concurrency
    parts; a wave of fewer requests is never shorter than their share of a busier one's."""
    at = {lv.concurrency: (lv.figures.get("seconds") or 0.0) / math.ceil(
        (lv.figures.get("requests") or requests) / lv.concurrency) for lv in levels}
    if concurrency in at:
        return at[concurrency]
    (a, wa), *rest = sorted(at.items(), key=lambda kv: (abs(kv[0] - concurrency), kv[0]))
    slope = max((rest[0][1] - wa) / (rest[0][0] - a), 0.0) if rest else wa / (FIXED_REQUESTS + a)
    return max(wa + slope * (concurrency - a), wa * min(concurrency / a, 1.0))


def level_seconds(levels: list, load: Load, concurrency: int) -> float:
    """A level of `load` at `concurrency`, modeled on `levels` that ran (their own requests, maybe
    another load's): requests go in waves of the concurrency (the warm-up's too), each as long as
    wave_seconds says (an estimate, and said as one)."""
    warm = min(load.warmup, load.requests)
    return wave_seconds(levels, concurrency, load.requests) * (
        math.ceil(load.requests / concurrency) + (math.ceil(warm / min(concurrency, warm)) if warm else 0))


def load_seconds(levels: list, load: Load) -> float:
    """The whole of `load`, modeled on `levels` that ran (0: no reading)."""
    return sum(level_seconds(levels, load, c) for c in load.concurrency) if levels else 0.0


def level_text(f: dict) -> str:
    """A level's figures in one line: tok/s, requests/s, TTFT and inter-token latency, accept length."""
    ms = lambda s: ("-" if s is None else f"{s:.2f} s" if s >= 1 else  # noqa: E731
                    f"{s * 1000:.0f} ms" if s >= 0.1 else f"{s * 1000:.1f} ms")
    return (f"{f['output_tok_s']:.1f} tok/s, {f['requests_s']:.2f} req/s, TTFT p50 {ms(f.get('ttft_p50'))} "
            f"p99 {ms(f.get('ttft_p99'))}, ITL p50 {ms(f.get('itl_p50'))} p99 {ms(f.get('itl_p99'))}"
            + (f", accept length {accept_text(f['accept_length'])}" if f.get("accept_length") else "")
            + (f", {f['failed']} of {f['requests']} failed" if f.get("failed") else ""))


def measure(run, svc: dict, load: Load, unit: str | None = None,
            ahead: Ahead | None = None) -> list[protocol.BenchLevel]:
    """The load, a request per level of concurrency, each level said as it ends; with `ahead` (a
    bench's own load, not a spec-tune candidate's) also where it is and about how long is left:
    its later levels modeled on how its waves grew with concurrency so far (wave_seconds)."""
    prompts, levels, n = load.prompt_list(), [], len(load.concurrency)
    if ahead:
        run.say(f"measuring {ahead.what}: concurrency {', '.join(map(str, load.concurrency))}; {load.requests} "
                f"requests a level" + (f" after {load.warmup} warm-up" if load.warmup else "")
                + f", up to {load.max_new_tokens} tokens each")
    for i, c in enumerate(load.concurrency):
        res = run.call(
            protocol.SpecBench(
                service=kinds.kind_of(svc).check(run.host, svc),
                prompts=prompts,
                unit=unit,
                concurrency=[c],
                requests=load.requests,
                warmup=load.warmup,
                max_new_tokens=load.max_new_tokens,
                seed=load.seed,
                **load.on_host(),
            ),
            on_stderr=lambda line: run.say(line.strip()),
        )
        levels += res.levels
        lv, where = res.levels[0], ""
        if ahead:
            ahead.pace.loaded(level_seconds(levels, load, c))
            rest = [pace_mod.load(level_seconds(levels, load, later)) for later in load.concurrency[i + 1:]]
            left = ahead.pace.says(rest + ahead.after(levels))
            where = f" ({i + 1} of {n}, {lv.figures.get('seconds') or 0:.0f} s" + (f"; {left})" if left else ")")
        run.say(f"  concurrency {c}: {level_text(lv.figures)}{where}")
    return levels


def measured(run, svc: dict, load: Load, with_baseline: bool, deployed: list | None = None) -> tuple[list, list | None]:
    """A bench's measurements: the load with speculation, then, `with_baseline`, the baseline in a
    GPU window (`deployed`: what the service is verified against after it), each level said with
    about how long is left (flows/pace.py: at the pace measured so far on this run)."""
    if not with_baseline:
        return measure(run, svc, load, ahead=Ahead("with speculation", pace_mod.Pace())), None
    pace = pace_mod.Pace(start=last_start(run, svc))
    # then the window's stop and the baseline's start, its load (modeled on this one's readings),
    # and the service's restart after it
    spec = measure(run, svc, load, ahead=Ahead("with speculation", pace, lambda levels: [
        pace_mod.SWITCH, pace_mod.load(load_seconds(levels, load)), pace_mod.SWITCH]))
    return spec, baseline(run, svc, load, pace, deployed)


def baseline(run, svc: dict, load: Load, pace: pace_mod.Pace,
             deployed: list | None = None) -> list[protocol.BenchLevel]:
    """Inside a GPU window, serve the target without speculation as a transient unit and measure it
    (said with the time left: its own later levels, and the service's restart after it)."""
    argv = transient.plain_argv(run, svc)  # refused before the window opens

    def body(serve):
        run.say("starting the baseline (no speculation)")
        with serve(argv) as unit:
            pace.switched()  # the window's stop and this unit's start, up to its ready
            return measure(run, svc, load, unit=unit, ahead=Ahead("the baseline", pace, lambda levels: [
                pace_mod.SWITCH]))
    return transient.window(run, svc, body, deployed)


def speedups(spec: list, base: list) -> dict[int, float]:
    """Per concurrency: spec tok/s ÷ baseline tok/s."""
    b = {lv.concurrency: lv.figures["output_tok_s"] for lv in base}
    return {lv.concurrency: round(lv.figures["output_tok_s"] / b[lv.concurrency], 3)
            for lv in spec if b.get(lv.concurrency)}


def verdict(gain: dict[int, float]) -> str:
    """One line a person reads: "speculative decoding: 1.84x at concurrency 1, 0.71x at 32: slower from 32 on"."""
    if not gain:
        return "speculative decoding: no baseline to compare with (run with --baseline)"
    parts = ", ".join(
        f"{g:.2f}x at {'concurrency ' if i == 0 else ''}{c}" for i, (c, g) in enumerate(sorted(gain.items()))
    )
    slower = [c for c, g in sorted(gain.items()) if g < 1.0]
    if not slower:
        tail = "faster at every level"
    elif len(slower) == len(gain):
        tail = "slower at every level"
    elif all(g < 1.0 for c, g in gain.items() if c >= slower[0]):
        tail = f"slower from {slower[0]} on"
    else:
        tail = f"slower at {', '.join(map(str, slower))}"
    return f"speculative decoding: {parts}: {tail}"


def result(run, svc: dict, load: Load, spec: list, base: list | None) -> dict:
    """What perf.json keeps: the figures (raw timings included), speedups, verdict, arguments, versions."""
    gain = speedups(spec, base) if base else {}
    pkgs = (run.facts.venv(kinds.venv_of(run.host)).get("packages") if run.facts else {}) or {}
    return {"service": svc["name"], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "args": kinds.kind_of(svc).args(svc), "load": load.identity(),
            "versions": {"sglang": pkgs.get("sglang"), "torch": pkgs.get("torch"), "agent": shipping.artifact()[1][:12],
                         "controller": platform.node()},
            "baseline_argv": transient.plain_argv(run, svc) if base else None,
            "spec": [protocol.encode(lv) for lv in spec], "baseline": [protocol.encode(lv) for lv in base or []],
            "speedup": {str(c): g for c, g in gain.items()}, "verdict": verdict(gain),
            "accept_length": {str(lv.concurrency): lv.figures.get("accept_length") for lv in spec}}


def bench(run, name: str | None, load: Load, with_baseline: bool, sample: traffic.Traffic | None = None) -> dict:
    """The body of `inv spec-bench`: measure (on a traffic sample when asked), maybe the baseline,
    say the verdict, record it."""
    facts = run.probe([], extra=protocol.Probe(venvs=[kinds.venv_of(run.host)]), lock=True)
    svc = service_of(run.host, name)
    if sample:
        traffic.refuse(run, svc, facts)
    if not run.call(protocol.Releases()).current:
        raise SpecopsError(f"{run.host.name}: no release to keep the result in: deploy first")
    with traffic.sampled(run, svc, sample) as taken:
        load = replace(load, sample=taken)
        spec, base = measured(run, svc, load, with_baseline)
        out = result(run, svc, load, spec, base)
    for lv in spec:
        f, b = lv.figures, next((b.figures for b in base or [] if b.concurrency == lv.concurrency), None)
        run.say(f"concurrency {lv.concurrency:>3}: {f['output_tok_s']:.1f} tok/s"
                + (f" (baseline {b['output_tok_s']:.1f})" if b else "")
                + (f", ITL p50 {f['itl_p50'] * 1000:.1f} ms" if f.get("itl_p50") is not None else "")
                + (f" (baseline {b['itl_p50'] * 1000:.1f})" if b and b.get("itl_p50") is not None else "")
                + (f", accept length {accept_text(f['accept_length'])}" if f.get("accept_length") else ""))
    run.say(out["verdict"])
    rec = run.call(protocol.PerfRecord(perf=out))
    run.report.notes.append(f"perf.json in release {rec.stamp}")
    run.report.extra["spec_bench"] = {k: out[k] for k in ("speedup", "verdict", "accept_length")}
    return out
