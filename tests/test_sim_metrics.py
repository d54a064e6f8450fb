"""The simulator's /metrics (sandbox/sglang_sim/sglang/sim_metrics.py): SGLang 0.5.23's Prometheus
metrics with --enable-metrics, figured from the requests' own counts, and the accept file that
lowers the acceptance while the server runs.  The server runs locally on a loopback port; no fleet."""
import gzip

from support.sim import KEY, MODEL, SPEC, generate, get, parse, scrape, server, tok, value

INTERVAL = 10  # --decode-log-interval: a window every 10 verify steps
SCHED = {"model_name": MODEL, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
GAUGES = ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:token_usage",
          "sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_num_steps",
          "sglang:spec_num_draft_tokens", "sglang:is_cuda_graph"]
# the real defaults (TokenizerMetricsCollector), as prometheus_client writes them in le
TTFT = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E = TTFT + [600, 1200, 1800, 2400]
ITL = [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4,
       0.6, 0.8, 1, 2, 4, 6, 8]


def last_window(steps, known_from=0):
    """(accept length, accept rate) of the last complete window of INTERVAL verify steps, from the
    tokens each step made since the server started, in order (known from index `known_from` on)."""
    start = (len(steps) // INTERVAL - 1) * INTERVAL
    assert start >= known_from
    window = steps[start:start + INTERVAL]
    return sum(window) / INTERVAL, (sum(window) - INTERVAL) / (INTERVAL * 3)  # 3: num_draft_tokens - 1


def step_tokens(progress):
    return [b - a for a, b in zip([0] + progress, progress)]


def test_without_enable_metrics_metrics_is_404_and_needs_no_key(tmp_path):
    with server(tmp_path, *SPEC) as base:
        assert get(base + "/metrics")[0] == 404
        assert get(base + "/v1/models")[0] == 401
        assert get(base + "/v1/models", Authorization="Bearer " + KEY)[0] == 200
        assert [get(base + p)[0] for p in ("/health", "/health_generate", "/ready")] == [200, 200, 200]


def test_names_types_labels_and_buckets_as_sglang_writes_them(tmp_path):
    with server(tmp_path, *SPEC, "--enable-metrics", "--decode-log-interval", str(INTERVAL)) as base:
        assert get(base + "/metrics")[2] == b""  # nothing written yet: a multiprocess registry shows nothing
        assert get(base + "/metrics/")[0] == 200 and get(base + "/v1/models")[0] == 401
        generate(base, 30, True)
        generate(base, 30, False)
        helps, types, samples = scrape(base)
        status, headers, body = get(base + "/metrics", **{"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip" and parse(gzip.decompress(body).decode())[1] == types
    counters = ["sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:spec_verify_calls_total",
                "sglang:num_requests_total", "sglang:cuda_graph_passes_total"]
    hists = {"sglang:time_to_first_token_seconds": TTFT, "sglang:inter_token_latency_seconds": ITL,
             "sglang:e2e_request_latency_seconds": E2E}
    assert types == {**dict.fromkeys(GAUGES, "gauge"), **dict.fromkeys(counters, "counter"),
                     **dict.fromkeys(hists, "histogram")}
    assert helps["sglang:spec_accept_length"] == ("Mean acceptance length of speculative decoding "
                                                  "(accepted drafts + bonus token per forward).")
    assert helps["sglang:prompt_tokens_total"] == "Number of prefill tokens processed."
    assert helps["sglang:e2e_request_latency_seconds"] == "Histogram of End-to-end request latency in seconds"
    for name in GAUGES:
        assert [lab for n, lab, _ in samples if n == name] == [SCHED]
    assert value(samples, "sglang:is_cuda_graph", **SCHED) == 0  # 0.5.23 never sets it
    # what tells instead: each decode forward by mode (each verify step here), each prefill "prefill_none"
    assert value(samples, "sglang:cuda_graph_passes_total", **SCHED, mode="decode_cuda_graph") == \
        value(samples, "sglang:spec_verify_calls_total", **tok())
    assert value(samples, "sglang:cuda_graph_passes_total", **SCHED, mode="prefill_none") == 2
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total"):
        assert sorted(lab["is_streaming"] for n, lab, _ in samples if n == name) == ["false", "true"]
        assert all(lab == tok(is_streaming=lab["is_streaming"]) for n, lab, _ in samples if n == name)
    assert [lab for n, lab, _ in samples if n == "sglang:spec_verify_calls_total"] == [tok()]
    for name, buckets in hists.items():
        streams = ["false", "true"] if name != "sglang:inter_token_latency_seconds" else [None]
        for s in streams:
            labels = tok() if s is None else tok(is_streaming=s)
            rows = [(lab["le"], v) for n, lab, v in samples if n == name + "_bucket"
                    and {k: x for k, x in lab.items() if k != "le"} == labels]
            assert [le for le, _ in rows] == [repr(float(b)) for b in buckets] + ["+Inf"]
            assert [v for _, v in rows] == sorted(v for _, v in rows)  # cumulative
            assert rows[-1][1] == value(samples, name + "_count", **labels) > 0
            assert value(samples, name + "_sum", **labels) > 0
    order = [n for n, _, _ in samples if n.startswith("sglang:e2e")]
    assert order[0].endswith("_sum") and order[-1].endswith("_count")


def test_counters_are_the_requests_sums_and_the_gauge_is_the_last_window(tmp_path):
    with server(tmp_path, *SPEC, "--enable-metrics", "--decode-log-interval", str(INTERVAL)) as base:
        plain = [generate(base, n, False, words=w)[0] for n, w in ((20, 2), (41, 5))]
        streamed = [generate(base, n, True, words=w) for n, w in ((37, 1), (25, 4), (48, 7), (33, 3))]
        helps, types, samples = scrape(base)
    metas = plain + [m for m, _ in streamed]
    assert value(samples, "sglang:generation_tokens_total", **tok(is_streaming="false")) == 61
    assert value(samples, "sglang:generation_tokens_total", **tok(is_streaming="true")) == 143
    assert value(samples, "sglang:prompt_tokens_total", **tok(is_streaming="false")) == 7
    assert value(samples, "sglang:prompt_tokens_total", **tok(is_streaming="true")) == 15
    assert sum(m["completion_tokens"] for m in metas) == 204
    assert value(samples, "sglang:spec_verify_calls_total", **tok()) == sum(m["spec_verify_ct"] for m in metas)
    assert value(samples, "sglang:num_requests_total", **tok(is_streaming="false")) == 2
    assert value(samples, "sglang:num_requests_total", **tok(is_streaming="true")) == 4
    assert value(samples, "sglang:time_to_first_token_seconds_count", **tok(is_streaming="true")) == 4
    # each stream event after the first observes its new tokens' inter-token latency, once per token
    assert value(samples, "sglang:inter_token_latency_seconds_count", **tok()) == sum(
        p[-1] - p[0] for _, p in streamed)
    assert value(samples, "sglang:e2e_request_latency_seconds_sum", **tok(is_streaming="true")) >= sum(
        m["e2e_latency"] for m, _ in streamed)
    # one stream event per verify step (stream interval 1): the steps' tokens, in order, after the
    # plain requests' steps; the gauge is the last complete window's ratio
    for meta, progress in streamed:
        assert len(progress) == meta["spec_verify_ct"]
    unknown = sum(m["spec_verify_ct"] for m in plain)
    length, rate = last_window([None] * unknown + [t for _, p in streamed for t in step_tokens(p)], unknown)
    assert value(samples, "sglang:spec_accept_length", **SCHED) == length
    assert abs(value(samples, "sglang:spec_accept_rate", **SCHED) - rate) < 1e-12
    assert 2.5 < length < 3.5  # alpha 0.8, 3 steps: 2.95 on average
    assert value(samples, "sglang:spec_num_steps", **SCHED) == 3
    assert value(samples, "sglang:spec_num_draft_tokens", **SCHED) == 4
    assert value(samples, "sglang:gen_throughput", **SCHED) == 0  # idle again: published as 0
    assert value(samples, "sglang:num_running_reqs", **SCHED) == 0


def test_the_accept_file_lowers_the_accept_length_of_the_next_requests(tmp_path):
    with server(tmp_path, *SPEC, "--enable-metrics", "--decode-log-interval", str(INTERVAL)) as base:
        steps = []  # every verify step's tokens since the start

        def run(requests=3):
            """The gauge after a few requests, and the last window's ratio, all of it theirs."""
            known = len(steps)
            steps.extend(t for _ in range(requests) for t in step_tokens(generate(base, 40, True)[1]))
            gauge = value(scrape(base)[2], "sglang:spec_accept_length", **SCHED)
            return gauge, last_window(steps, known)[0]
        before, window = run()
        assert before == window > 2.5  # alpha 0.8 (the knob): 2.95 on average
        (tmp_path / "accept_rate").write_text("0.1\n")
        low, window = run()
        assert low == window < 1.5  # alpha 0.1: 1.11 on average
        (tmp_path / "accept_rate").unlink()
        restored, window = run()
        assert restored == window > 2.5
