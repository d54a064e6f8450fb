"""spec-bench, the controller's side: does speculative decoding pay off on this host?

The load runs on the host (agent/bench/specbench.py); this module asks for it, runs the baseline in a
GPU window (the same target, the same arguments minus the speculative ones, as a transient unit:
agent/bench/baseline.py), always restores the service, turns the two measurements into speedups and a
plain verdict, and keeps the result with the current release (perf.json).
"""
from __future__ import annotations

import contextlib
import platform
import time
from dataclasses import dataclass, field

from . import pipeline, rolling
from .. import protocol, services
from ..prompts import read as read_prompts
from ..remote import shipping
from ..errors import SpecopsError, UsageError
from ..layout import BASELINE_PREFIX


@dataclass
class Load:
    """What spec-bench sends: the levels of concurrency, requests per level, tokens per request."""
    concurrency: list = field(default_factory=lambda: [1, 8, 32])
    requests: int = 64
    warmup: int = 4
    max_new_tokens: int = 128
    seed: int = 0
    prompts: str | None = None  # a prompt file (specops/prompts.py; default: files/prompts.json)

    def identity(self) -> dict:
        """What two results must share to be compared: the load, and the prompt set (its name,
        digest, and the prompts in it and sent)."""
        found = read_prompts(self.prompts)
        return {**{k: v for k, v in vars(self).items() if k != "prompts"},
                **found.identity(len(found.sample(self.requests, self.seed)))}

    def prompt_list(self) -> list:
        """The prompts to send (each a string or {"messages": [...]}): the file's, sampled down to
        the requests of a level by the seed when it holds more."""
        return read_prompts(self.prompts).sample(self.requests, self.seed)


def service_of(host, name: str | None) -> dict:
    """The one service to measure: --service, or the host's only one."""
    svcs = [s for _, s in services.of_host(host)]
    chosen = [s for s in svcs if s["name"] == name] if name else svcs
    if len(chosen) != 1:
        raise SpecopsError(f"{host.name}: give --service (one of: {', '.join(s['name'] for s in svcs) or 'none'})"
                           if not name or not chosen else f"{host.name}: no service {name!r}")
    return chosen[0]


def refuse_router_baseline(hosts, name: str | None) -> None:
    """Before connecting: a baseline of a router would stop it (every client's outage) and measure
    its 503; a router has no speculation to compare."""
    for h in hosts:
        svcs = [s for _, s in services.of_host(h) if not name or s["name"] == name]
        routers = [s["name"] for s in svcs if services.kind_of(s).name == "router"]
        if routers and len(svcs) == 1:
            raise UsageError(f"{h.name}: {routers[0]} is a router: --baseline measures an SGLang server without "
                             f"speculation (give --service, or measure its workers' hosts)")


def _check(run, svc) -> protocol.ServiceCheck:
    return services.kind_of(svc).check(run.host, svc)


def measure(run, svc: dict, load: Load, unit: str | None = None) -> list[protocol.BenchLevel]:
    res = run.call(protocol.SpecBench(service=_check(run, svc), prompts=load.prompt_list(), unit=unit,
                                      concurrency=load.concurrency, requests=load.requests,
                                      warmup=load.warmup, max_new_tokens=load.max_new_tokens, seed=load.seed),
                   on_stderr=lambda line: run.say(line.strip()))
    return res.levels


def baseline(run, svc: dict, load: Load, deployed: list | None = None) -> list[protocol.BenchLevel]:
    """Inside a GPU window, serve the target without speculation as a transient unit and measure it."""
    argv = plain_argv(run, svc)  # refused before the window opens

    def body(serve):
        run.say("starting the baseline (no speculation)")
        with serve(argv) as unit:
            return measure(run, svc, load, unit=unit)
    return window(run, svc, body, deployed)


def window(run, svc: dict, body, deployed: list | None = None):
    """A GPU window: stop the service (GPUs proven free), run `body(serve)`, and always start the
    service again and verify it (against `deployed`, a deploy not recorded yet, else the current
    release).  `serve(argv, label=, what=)` is a context that runs argv as the transient unit
    specops-baseline-<service> until it is ready and yields its name, then stops it, GPUs proven
    free again.  A worker is out of its routers meanwhile, and back once it verifies."""
    return rolling.out_of_routers(run, lambda: pipeline.in_window(
        run, [svc["name"]], lambda: body(lambda argv, **kw: serving(run, svc, argv, **kw)), deployed), [svc["name"]])


class GpusBusy(SpecopsError):
    """A transient unit stopped, and its GPUs are not free: the window cannot go on."""


@contextlib.contextmanager
def serving(run, svc: dict, argv: list, label: str = "baseline", what: str = "the target without speculation"):
    name, kind = svc["name"], services.kind_of(svc)
    env = dict(svc.get("env") or {})
    if svc.get("cuda_visible_devices"):
        env["CUDA_VISIBLE_DEVICES"] = str(svc["cuda_visible_devices"])
    ref, transient = kind.unit(svc), BASELINE_PREFIX + name
    check = _check(run, svc)
    try:
        run.call(protocol.BaselineStart(
            service=name, argv=argv, port=check.port, host=check.host, properties=kind.properties(svc),
            ready=check.endpoints.ready, env=env, gpus=ref.gpus, timeout=check.timeout, label=label, what=what),
            on_stderr=lambda line: run.say(line.strip()))
        yield transient
    finally:  # however it went (it may not have started, or been cut off): stopped
        res = run.call(protocol.Stop(services=[protocol.UnitRef(name=transient, gpus=ref.gpus,
                                                                titles=ref.titles, grace=ref.grace)],
                                     others=list(services.unit_refs(run.host))),
                       on_stderr=lambda line: run.say(line.strip()))
        for s in res.services:
            freed = ", ".join(f"GPU {i}: {mib} MiB" for i, mib in sorted(s.freed_mib.items())) or "none held"
            run.say(f"{label} stopped; freed {freed}; {len(s.left)} compute app(s) left on the GPUs")
            if s.failures or s.left:
                raise GpusBusy(f"the {label} left the GPUs busy: {'; '.join(s.failures) or s.left}")


def plain_argv(run, svc: dict) -> list[str]:
    """The baseline's command: the service's own, without its speculative arguments.  Refused when
    speculation would still be asked for (a --speculative-* flag in extra_args)."""
    argv = services.kind_of(svc).argv({**svc, "speculative": None}, services.venv_of(run.host))
    left = [a for a in argv if a.startswith("--speculative")]
    if left:
        raise SpecopsError(f"{svc['name']}: the baseline would still speculate ({left[0]} in extra_args); "
                           "put speculation under `speculative:`")
    return argv


def speedups(spec: list, base: list) -> dict[int, float]:
    """Per concurrency: spec tok/s ÷ baseline tok/s."""
    b = {lv.concurrency: lv.figures["output_tok_s"] for lv in base}
    return {lv.concurrency: round(lv.figures["output_tok_s"] / b[lv.concurrency], 3)
            for lv in spec if b.get(lv.concurrency)}


def verdict(gain: dict[int, float]) -> str:
    """One line a person reads: "speculative decoding: 1.84x at concurrency 1, 0.71x at 32: slower from 32 on"."""
    if not gain:
        return "speculative decoding: no baseline to compare with (run with --baseline)"
    parts = ", ".join(f"{g:.2f}x at {'concurrency ' if i == 0 else ''}{c}" for i, (c, g) in enumerate(sorted(gain.items())))
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
    pkgs = (run.facts.venv(services.venv_of(run.host)).get("packages") if run.facts else {}) or {}
    return {"service": svc["name"], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "args": services.kind_of(svc).args(svc), "load": load.identity(),
            "versions": {"sglang": pkgs.get("sglang"), "torch": pkgs.get("torch"), "agent": shipping.artifact()[1][:12],
                         "controller": platform.node()},
            "baseline_argv": plain_argv(run, svc) if base else None,
            "spec": [protocol.encode(lv) for lv in spec], "baseline": [protocol.encode(lv) for lv in base or []],
            "speedup": {str(c): g for c, g in gain.items()}, "verdict": verdict(gain),
            "accept_length": {str(lv.concurrency): lv.figures.get("accept_length") for lv in spec}}


def bench(run, name: str | None, load: Load, with_baseline: bool) -> dict:
    """The body of `inv spec-bench`: measure, maybe the baseline, say the verdict, record it."""
    run.probe([], extra=protocol.Probe(venvs=[services.venv_of(run.host)]), lock=True)
    svc = service_of(run.host, name)
    if not run.call(protocol.Releases()).current:
        raise SpecopsError(f"{run.host.name}: no release to keep the result in: deploy first")
    spec = measure(run, svc, load)
    base = baseline(run, svc, load) if with_baseline else None
    out = result(run, svc, load, spec, base)
    for lv in spec:
        f = lv.figures
        run.say(f"concurrency {lv.concurrency:>3}: {f['output_tok_s']:.1f} tok/s"
                + (f" (baseline {next(b.figures['output_tok_s'] for b in base if b.concurrency == lv.concurrency):.1f})"
                   if base else "")
                + (f", accept length {f['accept_length']:.2f}" if f.get("accept_length") else ""))
    run.say(out["verdict"])
    rec = run.call(protocol.PerfRecord(perf=out))
    run.report.notes.append(f"perf.json in release {rec.stamp}")
    run.report.extra["spec_bench"] = {k: out[k] for k in ("speedup", "verdict", "accept_length")}
    return out
