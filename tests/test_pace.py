"""Issue 50, item 5: the time spec-bench and spec-tune say is left holds on a host slower than the
model (specops/flows/pace.py).  A made-up host and clock: every load runs twice as long as its model
(the level's own per-wave time, warm-up waves included) and every switch (the window's stop and a
transient unit's start, one unit for the next, the service's restart and verify after the window)
takes five times the service's last start from its journal (or, with quick restarts, 15 s after a
5 s start).  A wave of requests takes longer the more run at once: along a line (`linear`), or as
the simulator's performance model has it (`sim`: sandbox/sglang_sim/sglang/sim_perf.py, its default
knobs, a curve the estimator does not know).  From the halfway point of the run, in its own time,
every estimate said is within 30% of the time that was truly left.  No fleet."""
import math
import re
from contextlib import contextmanager

import pytest

from sandbox.oracle import sim_perf
from specops import protocol
from specops.flows import pace, specbench, transient, tuning

START = 30.0  # the service's last start, from its journal
PACE = 2.0    # a load's wall time over its model
SWITCH = 5.0  # a switch over START


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class SlowHost:
    """A host whose loads run at PACE × their model, its waves growing with concurrency as `shape`
    has them, and whose last start in its journal is `start`: each said line kept with the time it
    was said."""

    def __init__(self, clock, svc, shape="linear", start=START):
        from specops import inventory
        self.clock, self.svc, self.said, self.serving = clock, svc, [], None
        self.shape, self.start = shape, start
        self.host = inventory.Host("t1", {"services": [svc]})
        self.report = type("Report", (), {"notes": [], "extra": {}})()

    def say(self, text):
        self.said.append((self.clock.t, text))

    def probe(self, *a, **kw):
        return None

    def wave(self, c, tokens):
        """Seconds a wave of `c` requests of `tokens` each takes: longer as concurrency grows; the
        target alone is slower than with a draft at 1, faster at 32 (where speculation costs more
        than it gives).  `linear`: along a line; `sim`: the simulator's steady tok/s at c."""
        argv = self.serving or []
        alone = self.serving is not None and not any(a.startswith("--speculative") for a in argv)
        own = self.svc["speculative"]
        knob = lambda flag, key: int(argv[argv.index(flag) + 1]) if flag in argv else own[key]  # noqa: E731
        steps = knob("--speculative-num-steps", "num_steps")
        if self.shape == "sim":
            settings = None if alone else (steps, knob("--speculative-eagle-topk", "eagle_topk"),
                                           knob("--speculative-num-draft-tokens", "num_draft_tokens"))
            return tokens * c / sim_perf.steady_tok_s({}, c, settings)
        return (1 + c / 8) * ({1: 1.8, 8: 1.2}.get(c, 0.9) if alone else 1 - 0.01 * steps)

    def call(self, req, on_stderr=None, **kw):
        if isinstance(req, protocol.Startup):
            return protocol.StartupResult(seconds=self.start)
        if isinstance(req, protocol.Releases):
            return protocol.ReleasesResult(current="r1", releases=[])
        if isinstance(req, protocol.PerfRecord):
            return protocol.RecordResult(stamp="r1", files=0)
        (c,) = req.concurrency
        wave, warm = self.wave(c, req.max_new_tokens), min(req.warmup, req.requests)
        waves = math.ceil(req.requests / c) + (math.ceil(warm / min(c, warm)) if warm else 0)
        self.clock.t += PACE * wave * waves
        tok_s = 48 * c / wave
        return protocol.SpecBenchResult(levels=[protocol.BenchLevel(concurrency=c, raw=[], figures={
            "output_tok_s": tok_s, "requests_s": c / wave, "seconds": wave * math.ceil(req.requests / c),
            "requests": req.requests, "failed": 0, "itl_p99": 0.01, "accept_length": 2.5})])


def slow_window(monkeypatch, clock, stop=2 * START, up=(SWITCH - 2) * START):
    """transient.window on SlowHost: each switch a `stop` and a start `up` (SWITCH × START in all)."""

    def window(run, svc, body, deployed=None):
        clock.t += stop  # the service stopped, its GPUs proven free

        @contextmanager
        def serve(argv, **kw):
            clock.t += up
            run.serving = argv
            try:
                yield "specops-baseline-sglang"
            finally:
                run.serving = None
                clock.t += stop
        try:
            return body(serve)
        finally:
            clock.t += up  # the service started again and verified
    monkeypatch.setattr(transient, "window", window)


def held(said, end):
    """(when, said, truly left) of each estimate said from the halfway point on."""
    out = []
    for t, text in said:
        found = re.search(r"about ([\d.]+) (s|min) left", text)
        if found and t >= end / 2:
            out.append((t, float(found[1]) * (60 if found[2] == "min" else 1), end - t))
    return out


def paced(monkeypatch, **switch):
    clock = Clock()
    slow_window(monkeypatch, clock, **switch)
    monkeypatch.setattr(pace, "now", clock)
    return clock


def bench_held(monkeypatch, baseline, shape="linear", start=START, **switch):
    """spec-bench's default load (concurrency 1, 8, 32; 64 requests after 4 warm-up) on SlowHost:
    the estimates said from the halfway point on, and every line said."""
    from sandbox.provision import sandbox_service
    clock = paced(monkeypatch, **switch)
    run = SlowHost(clock, sandbox_service(), shape, start)
    specbench.measured(run, run.svc, specbench.Load(), baseline)
    return held(run.said, clock.t), run.said


@pytest.mark.parametrize("shape", ["linear", "sim"])
@pytest.mark.parametrize("baseline, start, stop, up", [
    (True, START, 2 * START, (SWITCH - 2) * START),  # the switches five times the last start
    (True, 5.0, 10.0, 5.0),  # quick restarts: the loads are most of the run
    (False, START, 0, 0)])  # no window: the first level (at concurrency 1) is most of the run
def test_spec_bench_says_what_is_left_within_30pct_from_halfway(monkeypatch, shape, baseline, start, stop, up):
    """With --baseline, the baseline's levels are said past the halfway point.  Before pace.py they
    counted the service's restart as its journal's 30 s and the load at the model's pace: "about
    54 s left" with 220 s to go, 37 with 177, 30 with 150 (linear).  A level at a higher
    concurrency has longer waves than the one before it: when each later level was modeled on the
    one that just ran (its waves as long), the plain bench said "about 26 s left" with 64 s to go
    and 12 with 29 (linear; sim: 16 with 30, 6 with 14), and with quick restarts the baseline's
    first level "about 64 s" with 85 and its second 29 with 42 (linear)."""
    late, lines = bench_held(monkeypatch, baseline, shape, start, stop=stop, up=up)
    assert len(late) >= 2, lines
    assert all(abs(said - left) <= 0.3 * left for _, said, left in late), (late, lines)


@pytest.mark.parametrize("shape", ["linear", "sim"])
@pytest.mark.parametrize("concurrency, requests", [([1], 16), ([1, 8, 32], 64)])
def test_spec_tune_says_what_is_left_after_each_candidate_within_30pct_from_halfway(monkeypatch, shape, concurrency,
                                                                                   requests):
    """Each candidate's line says what is left: the climb's short loads, the finalists' full loads,
    the baseline again and the service's restart, at the pace measured so far (before pace.py
    they said nothing after the up-front line).  The short load runs at the objective's level
    alone (1): the full load's busier levels are modeled on it until a full load ran."""
    from sandbox.provision import sandbox_service
    clock = paced(monkeypatch)
    svc = sandbox_service(tune={"num_steps": [1, 2, 3, 5], "eagle_topk": [1, 2, 4, 8],
                                "num_draft_tokens": [2, 4, 8, 16]})
    run = SlowHost(clock, svc, shape)
    monkeypatch.setattr(tuning, "check_drafts", lambda *a: None)
    monkeypatch.setattr(tuning, "check_runs_as_asked", lambda *a: None)
    ask = tuning.Ask(load={"concurrency": concurrency, "requests": requests, "max_new_tokens": 48}, budget=8)
    tuning.tune(run, "sglang", ask)
    candidates = [(t, s) for t, s in run.said if re.match(r"steps \d+, topk \d+, draft tokens \d+ \[", s)]
    assert len(candidates) == 6 and all(s.endswith(" left") for _, s in candidates), run.said
    late = held(run.said, clock.t)
    assert len(late) >= 2, run.said
    assert all(abs(said - left) <= 0.3 * left for _, said, left in late), (late, run.said)


def test_the_first_readings_set_the_pace_and_a_measured_switch_replaces_the_journals():
    """Loads at measured over modeled seconds of the loads done; a switch as the service's last
    start at that pace plus STOP_S until one is measured, then as the mean of those measured; the
    step under way (since the last one ended) counted as partly behind."""
    clock = Clock()
    p = pace.Pace(start=START, clock=clock)
    plan = [pace.load(10), pace.SWITCH, pace.load(20), pace.SWITCH]
    assert p.left(plan) == 10 + 20 + 2 * (START + pace.STOP_S)  # nothing measured: the model's pace
    clock.t += 20
    p.loaded(10)  # twice its model
    assert p.rate() == 2 and p.left(plan) == 60 + 2 * (2 * START + pace.STOP_S)
    clock.t += 100
    p.switched()
    clock.t += 200
    p.switched()
    assert p.switch() == 150 and p.left(plan) == 60 + 300
    clock.t += 5  # the plan's first load (10 s at 2×) under way for 5 s
    assert p.left(plan) == 15 + 150 + 40 + 150
    clock.t += 45  # longer than it was expected to take: none of it counted as left, never less
    assert p.left(plan) == 0 + 150 + 40 + 150
    assert pace.Pace(clock=clock).says([pace.load(30), pace.SWITCH]) == \
        "about 30 s of load left, and 1 start(s) of unknown length"
    assert pace.Pace(clock=clock).says([pace.load(0.4)]) == ""  # under a second: nothing said


def test_spec_tunes_plan_counts_the_restarts_its_header_says_and_the_finalists_the_climb_picked():
    """The up-front line's restarts are the plan's transient starts (the budget per draft, the two
    baselines shared): 2 drafts at a budget of 8 make 14; the finalists' full loads in the plan are
    as many as the climb says it measures once it ends (fewer or more than the budget's reserve)."""
    from specops.flows.tuning_search import Search
    from specops.sglang import climb, tuning as space_mod
    from sandbox.provision import sandbox_service
    svc = sandbox_service()
    load = specbench.Load(concurrency=[1], requests=8, warmup=0)
    s = Search(None, svc, None, None, load, load, 8, [svc["speculative"]["draft_model_path"], "/models/other"])
    assert sum(st.switch for st in s.ahead()) - 1 == 8 * 2 - 2
    s.told[svc["speculative"]["draft_model_path"]] = 5  # the first draft's climb ended: 5 finalists, not 2
    assert sum(st.switch for st in s.ahead()) - 1 == 2 + 5 + 6
    space = space_mod.prune(svc, space_mod.asked_space(svc, {"num_steps": [1, 2, 3, 5], "eagle_topk": [1, 2, 4],
                                                             "num_draft_tokens": [2, 4, 8, 16]}))
    start = space_mod.Settings(3, 1, 4)
    picked = []
    for peak in (start, space.candidates[0]):  # a lone peak: it alone is a finalist; another: two are
        fulls, told = [], []
        climb.search(space.candidates, lambda c: 300.0 if c == peak else 100.0 + c.num_steps,
                     lambda c: fulls.append(c) or 100.0, start, 12, told=told.append)
        assert told == [len(fulls)], (peak, told, fulls)
        picked += told
    assert climb.rungs(12) == (8, 2) and picked != [2, 2], picked  # not always the budget's reserve


def searching(clock, fails=None):
    """spec-tune's Search on SlowHost, its Pace on `clock`, and a serve() whose unit takes 40 s to
    start (or fails to, after 40 s, with `fails`)."""
    from sandbox.provision import sandbox_service
    from specops.errors import SpecopsError
    from specops.flows.tuning_search import Search
    run = SlowHost(clock, sandbox_service())
    load = specbench.Load(concurrency=[1], requests=8, warmup=0)
    search = Search(run, run.svc, None, None, load, load, 8, [run.svc["speculative"]["draft_model_path"]],
                    pace.Pace(clock=clock))

    @contextmanager
    def serve(argv, **kw):
        clock.t += 40
        if fails:
            raise SpecopsError(fails)
        yield "specops-baseline-sglang"
    return run, search, serve


def test_a_candidate_that_did_not_start_took_a_switch_and_one_cut_short_took_neither():
    """A failed start is a restart's time; a load cut short has no model to weigh its time by, so
    it is left out of both (tuning_search.Search.measure)."""
    from specops.errors import SpecopsError
    from specops.sglang.tuning import Settings
    clock = Clock()
    run, search, serve = searching(clock, fails="exited during boot")
    assert search.measure(serve, search.draft, Settings(3, 1, 4), search.short, "short") is None
    assert search.pace.switches == [40] and search.pace.loads == []
    run, search, serve = searching(clock)

    def cut_short(req, **kw):
        clock.t += 7
        raise SpecopsError("connection reset")
    run.call = cut_short
    assert search.measure(serve, search.draft, Settings(3, 1, 4), search.short, "short") is None
    assert search.pace.switches == [40] and search.pace.loads == [] and search.pace.since == clock.t


def test_the_baselines_start_is_a_switch_and_its_load_is_timed_from_its_ready():
    """spec-tune's baseline (Search.plain): its unit's start is timed as a switch, its load alone
    against its model (PACE × it on SlowHost)."""
    clock = Clock()
    run, search, serve = searching(clock)
    search.plain(serve)
    assert search.pace.switches == [40] and search.pace.rate() == PACE
