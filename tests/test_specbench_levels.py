"""What spec-bench says as it measures (specops/flows/specbench.py): each level as it ends, with its
latencies and about how long is left, with and without --baseline; and spec-tune's estimate, by
the same definition (flows/pace.py; tests/test_pace.py holds them on a host slower than the
model).  No fleet."""
from pytest import approx

from specops import protocol


LEVELS = {1: {"output_tok_s": 50.0, "requests_s": 0.5, "ttft_p50": 0.12, "ttft_p99": 0.3, "itl_p50": 0.0102,
              "itl_p99": 0.014, "accept_length": 2.909090909090909, "seconds": 16.0, "requests": 8, "failed": 0},
          8: {"output_tok_s": 300.0, "requests_s": 2.67, "ttft_p50": 0.2, "ttft_p99": 1.5, "itl_p50": 0.02,
              "itl_p99": 0.031, "accept_length": 2.5, "seconds": 3.0, "requests": 8, "failed": 1}}


class BenchRun:
    """A host whose agent answers each level with LEVELS' figures, and its last start with `start`;
    each level takes as long as its figures say (no warm-up: the model exactly)."""

    def __init__(self, monkeypatch, start=30.0):
        from sandbox.provision import sandbox_service
        from specops import inventory
        from specops.flows import pace
        self.svc = sandbox_service()
        self.host, self.start = inventory.Host("t1", {"services": [self.svc]}), start
        self.said, self.sent, self.t = [], [], 0.0
        monkeypatch.setattr(pace, "now", lambda: self.t)

    def say(self, text):
        self.said.append(text)

    def call(self, req, on_stderr=None, **kw):
        self.sent.append(req)
        if isinstance(req, protocol.Startup):
            return protocol.StartupResult(seconds=self.start)
        (c,) = req.concurrency
        self.t += LEVELS[c]["seconds"]
        return protocol.SpecBenchResult(levels=[protocol.BenchLevel(concurrency=c, figures=LEVELS[c], raw=[])])


def test_spec_bench_says_each_level_with_its_latencies_and_the_time_left(monkeypatch):
    """Issue 38: spec-bench was silent for minutes with no estimate, and its lines had no inter-token
    latency.  Now a request per level, each said as it ends with TTFT and ITL and about how long is
    left: the later levels in waves of their concurrency, each longer than a request took as more
    share the batch (16 s for 8 requests one at a time: 2 s a wave; with one reading, 2 s ×
    (16 + 8) / (16 + 1) at concurrency 8: specbench.FIXED_REQUESTS), at the pace measured (here the
    model's), and with --baseline the window's two switches (issue 50: each the service's last
    start, 30 s, and 10 s for what its journal leaves out, the stop and the proof of free memory,
    until one is measured) and the same load."""
    from specops.flows import specbench as flow
    load = flow.Load(concurrency=[1, 8], requests=8, warmup=0, max_new_tokens=16)
    run = BenchRun(monkeypatch)
    spec, base = flow.measured(run, run.svc, load, with_baseline=False)
    assert [lv.concurrency for lv in spec] == [1, 8] and base is None
    assert [r.concurrency for r in run.sent] == [[1], [8]]  # a request per level
    assert run.said == [
        "measuring with speculation: concurrency 1, 8; 8 requests a level, up to 16 tokens each",
        "  concurrency 1: 50.0 tok/s, 0.50 req/s, TTFT p50 120 ms p99 300 ms, ITL p50 10.2 ms p99 14.0 ms, "
        "accept length 2.91 (1 of 2, 16 s; about 3 s left)",
        "  concurrency 8: 300.0 tok/s, 2.67 req/s, TTFT p50 200 ms p99 1.50 s, ITL p50 20.0 ms p99 31.0 ms, "
        "accept length 2.50, 1 of 8 failed (2 of 2, 3 s)"]
    measured_base = []
    monkeypatch.setattr(flow, "baseline", lambda run, svc, load, pace, deployed: measured_base.append(pace.start) or [])
    run = BenchRun(monkeypatch)
    flow.measured(run, run.svc, load, with_baseline=True)
    assert isinstance(run.sent[0], protocol.Startup) and measured_base == [30.0]
    # 2 switches of 30 + 10 s, 3 s of this load left, 19 s of the baseline's; then 80 + 19 s
    assert run.said[1].endswith("(1 of 2, 16 s; about 1.7 min left)")
    assert run.said[2].endswith("(2 of 2, 3 s; about 1.6 min left)")
    run = BenchRun(monkeypatch, start=None)
    flow.measured(run, run.svc, load, with_baseline=True)
    assert run.said[1].endswith("(1 of 2, 16 s; about 22 s of load left, and 2 start(s) of unknown length)")


def test_spec_tune_estimates_with_spec_benchs_one_definition(monkeypatch):
    """The same estimate, said before spec-tune's first restart, of every restart its budget allows
    (4: the baseline, one candidate on the short load, one finalist on the full load, the baseline
    again; then the service's own restart): 5 switches of 30 + 10 s, the short load (16 s) and
    three full loads of 4 × its requests (64 s each)."""
    from specops.flows import specbench as flow, tuning
    from specops.flows.tuning_search import Search
    run = BenchRun(monkeypatch)
    short, full = flow.Load(concurrency=[1], requests=8, warmup=0), flow.Load(concurrency=[1], requests=32, warmup=0)
    search = Search(run, run.svc, None, None, full, short, 4, [run.svc["speculative"]["draft_model_path"]])
    tuning.estimate(run, run.svc, search, "16 restarts (15 combinations + the baseline)")
    assert run.said[-1] == "at most 4 restarts, where the full grid would need 16 restarts (15 combinations + the " \
                           "baseline); each 30 s start (its last, measured) + 16 s of short load: about 6.8 min " \
                           "if all are used"


def test_a_later_level_is_modeled_on_how_waves_grew_with_concurrency_on_this_run():
    """specbench.wave_seconds: a reading's own wave where a level ran at that concurrency; else on
    the line through the two nearest readings (never falling as concurrency grows, never under a
    busier wave's share); with one reading, FIXED_REQUESTS + concurrency parts."""
    from specops.flows.specbench import FIXED_REQUESTS as K, wave_seconds
    reading = lambda c, seconds, requests=8: protocol.BenchLevel(  # noqa: E731
        concurrency=c, figures={"seconds": seconds, "requests": requests}, raw=[])
    one, eight = reading(1, 16.0), reading(8, 3.0)  # 2 s a wave, then 3 s
    assert wave_seconds([one, eight], 8, 8) == 3.0
    assert wave_seconds([one, eight], 32, 8) == approx(3.0 + 24 / 7)
    assert wave_seconds([one, eight], 4, 8) == approx(2.0 + 3 / 7)
    assert wave_seconds([one], 8, 8) == approx(2.0 * (K + 8) / (K + 1))
    assert wave_seconds([reading(32, 6.0, 64)], 1, 64) == approx(3.0 * (K + 1) / (K + 32))  # a load run busiest first
    assert wave_seconds([one, reading(8, 1.5)], 32, 8) == 1.5  # the busier level was the quicker: level
    assert wave_seconds([reading(8, 1.0), reading(32, 10.0, 32)], 1, 8) == 1.0 / 8  # its share of a wave at 8
    assert wave_seconds([reading(1, 16.0, None)], 1, 4) == 4.0  # a reading that does not say its requests
