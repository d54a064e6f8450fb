"""/metrics with --enable-metrics: SGLang 0.5.23's Prometheus metrics, from the simulator's own
request and step counters (the `made` and `verify_ct` its /generate meta_info reports).

Real SGLang (srt/utils/common.py add_prometheus_middleware) serves prometheus_client's
exposition of a MultiProcessCollector over PROMETHEUS_MULTIPROC_DIR; this module writes the same
text by hand (the simulator's package index carries no prometheus_client):
  - Content-Type text/plain; version=0.0.4; charset=utf-8, gzip when Accept-Encoding asks for it
    (prometheus_client's _bake_output); an OpenMetrics Accept header is not honoured here;
  - a metric shows only once a sample of it was written (a multiprocess file holds only written
    children): the scheduler's gauges after the first request (or 30 s idle), the tokenizer's
    counters and histograms after the first finished request;
  - labels sorted by name (le among them), values as floatToGoString; a counter as
    `# TYPE name_total counter` with its `_total` sample and no `_created`; a histogram's
    `_sum`, then its cumulative `_bucket`s up to le="+Inf", then `_count`; gauges in
    multiprocess_mode "mostrecent", so with no pid label.

The scheduler's gauges (srt/observability/metrics_collector.py SchedulerMetricsCollector; labels
model_name = the served model name, engine_type "unified", tp_rank, pp_rank, moe_ep_rank "0") are
published as its metrics reporter (managers/scheduler_components/metrics_reporter.py) does:
  - at each prefill (here: a request's start): num_running_reqs, num_queue_reqs, gen_throughput
    (the last window's, 0 once 30 s stale), token_usage; the spec gauges keep their last values;
  - at the end of every --decode-log-interval decode forwards (default 40; report_decode_stats):
    gen_throughput = tokens generated in the window / the window's wall time (since the previous
    window ended, idle time included), spec_accept_length = accepted tokens / forwards,
    spec_accept_rate = correct drafts / (forwards * (num_draft_tokens - 1)), spec_num_steps,
    spec_num_draft_tokens (all 0 without speculation); the window's counts then start again;
  - idle (_maybe_log_idle_metrics): with no request running, once the running gauge is stale or
    30 s after the last publication, num_running_reqs and gen_throughput go to 0 and the spec
    gauges keep their last values (evaluated here when /metrics is read).
  The simulator has no batch: each request's verify step is one decode forward (batch size 1),
  so a window is decode_log_interval request-steps; its ratios are the same as a batch's.
  sglang:is_cuda_graph is 0: 0.5.23 never sets SchedulerStats.is_cuda_graph (its default 0)
  whatever --disable-cuda-graph says; sglang:cuda_graph_passes_total{mode} is what tells (each
  decode forward "decode_cuda_graph", or "decode_none" with --disable-cuda-graph; each prefill
  "prefill_none").  token_usage is 0 (the simulator has no KV pool; /v1/loads
  says the same); num_queue_reqs is 0 (no queue).

The tokenizer's metrics (TokenizerMetricsCollector; labels model_name, engine_type) follow
TokenizerManager.collect_metrics, at each output batch the scheduler sends (a streaming request's
stream events; a non-streaming one's every SGLANG_FORCE_STREAM_INTERVAL = 50 tokens and at its
end): the first observes time_to_first_token (a non-streaming request's from the scheduler's first
token), later ones inter_token_latency (interval / new tokens, counted once per token), the last
adds the request to the counters (observe_one_finished_request: prompt, generation tokens and
requests by is_streaming, spec_verify_calls when > 0) and observes e2e_request_latency.
"""
import gzip
import math
import os
import threading
import time

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STALE_SECONDS = 30.0  # GEN_THROUGHPUT_STALENESS_SECONDS, and the idle publication's period
FORCE_STREAM_INTERVAL = int(os.environ.get("SGLANG_FORCE_STREAM_INTERVAL", "50"))

SCHEDULER_GAUGES = [  # (name, HELP) as metrics_collector.py declares them
    ("sglang:num_running_reqs", "The number of running requests."),
    ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    ("sglang:gen_throughput", "The generation throughput (token/s)."),
    ("sglang:token_usage", "The token usage."),
    ("sglang:spec_accept_length",
     "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward)."),
    ("sglang:spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
    ("sglang:spec_num_steps", "Currently active speculative_num_steps."),
    ("sglang:spec_num_draft_tokens",
     "Currently active speculative_num_draft_tokens (decouples from steps under topk>1)."),
    ("sglang:is_cuda_graph", "Whether the batch is using CUDA graph."),
]
COUNTERS = [  # (name without _total, HELP, split by is_streaming)
    ("sglang:prompt_tokens", "Number of prefill tokens processed.", True),
    ("sglang:generation_tokens", "Number of generation tokens processed.", True),
    ("sglang:spec_verify_calls", "Number of speculative decoding verification calls.", False),
    ("sglang:num_requests", "Number of requests processed.", True),
]
GRAPH_PASSES_HELP = "Total number of forward passes categorized by CUDA graph."
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = TTFT_BUCKETS + [600, 1200, 1800, 2400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
               0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
HISTOGRAMS = [  # (name, HELP, buckets, split by is_streaming)
    ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS, True),
    ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS, False),
    ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", E2E_BUCKETS, True),
]


def go_float(d):
    """prometheus_client.utils.floatToGoString."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = ("%s.%s%s" % (s[0], s[1:dot], s[dot + 1:])).rstrip("0.")
        return "%se+%02d" % (mantissa, dot - 1)
    return s


def _escape(v):
    return str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def sample(name, labels, value):
    inner = ",".join('%s="%s"' % (k, _escape(v)) for k, v in sorted(labels.items()))
    return "%s%s %s\n" % (name, "{%s}" % inner if inner else "", go_float(value))


def header(name, help_text, typ):
    return "# HELP %s %s\n# TYPE %s %s\n" % (name, help_text.replace("\\", r"\\").replace("\n", r"\n"), name, typ)


class Metrics:
    """One server's metrics; every method is safe from the request threads."""

    def __init__(self, args, perf):
        self.perf = perf  # sim_perf.Model: `running`, the requests in flight
        self.speculative = bool(args.speculative_algorithm)
        self.num_steps = args.speculative_num_steps or 0
        self.num_draft_tokens = args.speculative_num_draft_tokens or 0
        self.interval = max(1, int(args.decode_log_interval))
        self.tok_labels = {"model_name": args.served_model_name, "engine_type": "unified"}
        self.sched_labels = dict(self.tok_labels, tp_rank="0", pp_rank="0", moe_ep_rank="0")
        self.lock = threading.Lock()
        now = time.perf_counter()
        self.last_log_time = self.last_decode_tic = now
        self.forward_ct = self.gen_tokens = self.accept_tokens = self.correct_drafts = self.spec_forwards = 0
        self.last_gen_throughput = 0.0
        self.stats = dict.fromkeys((n for n, _ in SCHEDULER_GAUGES), 0.0)  # SchedulerStats
        self.published = None  # the gauges' values once log_stats ran
        self.counters = {}  # (name, is_streaming or None) -> value
        self.hists = {name: {} for name, _, _, _ in HISTOGRAMS}  # name -> {is_streaming: [buckets, sum]}
        # sglang:cuda_graph_passes_total by mode (increment_decode/prefill_cuda_graph_pass): a decode
        # forward runs its CUDA graph unless --disable-cuda-graph; a prefill here never does
        self.graph_mode = "decode_none" if getattr(args, "disable_cuda_graph", False) else "decode_cuda_graph"
        self.graph_passes = {}

    # -- scheduler ----------------------------------------------------------------------------
    def _log_stats(self, now):
        self.published = dict(self.stats)
        self.last_log_time = now

    def prefill(self):
        """A request enters the running batch (report_prefill_stats)."""
        with self.lock:
            now = time.perf_counter()
            if now - self.last_decode_tic > STALE_SECONDS:
                self.last_gen_throughput = 0.0
            self.stats.update({"sglang:num_running_reqs": self.perf.running, "sglang:num_queue_reqs": 0,
                               "sglang:gen_throughput": self.last_gen_throughput, "sglang:token_usage": 0.0})
            self._log_stats(now)
            self.graph_passes["prefill_none"] = self.graph_passes.get("prefill_none", 0) + 1

    def decode_step(self, tokens):
        """One verify step of one request that made `tokens` (report_decode_stats)."""
        with self.lock:
            self.forward_ct += 1
            self.gen_tokens += tokens
            self.graph_passes[self.graph_mode] = self.graph_passes.get(self.graph_mode, 0) + 1
            if self.speculative:  # update_spec_metrics, bs 1
                self.accept_tokens += tokens
                self.correct_drafts += tokens - 1
                self.spec_forwards += 1
            if self.forward_ct % self.interval:
                return
            now = time.perf_counter()
            self.last_gen_throughput = self.gen_tokens / max(now - self.last_decode_tic, 1e-9)
            self.last_decode_tic, self.gen_tokens = now, 0
            length = rate = steps = drafts = 0
            if self.speculative and self.spec_forwards:
                per_round = self.num_draft_tokens - 1 if self.num_draft_tokens else self.num_steps
                length = self.accept_tokens / self.spec_forwards
                rate = self.correct_drafts / (self.spec_forwards * per_round) if per_round > 0 else 0
                steps, drafts = self.num_steps, self.num_draft_tokens
            self.accept_tokens = self.correct_drafts = self.spec_forwards = 0
            self.stats.update({"sglang:num_running_reqs": self.perf.running, "sglang:num_queue_reqs": 0,
                               "sglang:gen_throughput": self.last_gen_throughput, "sglang:token_usage": 0.0,
                               "sglang:spec_accept_length": length, "sglang:spec_accept_rate": rate,
                               "sglang:spec_num_steps": steps, "sglang:spec_num_draft_tokens": drafts})
            self._log_stats(now)

    def _maybe_log_idle(self):
        now = time.perf_counter()
        if self.perf.running:
            return
        stale = self.stats["sglang:num_running_reqs"] != 0
        if not stale and now <= self.last_log_time + STALE_SECONDS:
            return
        self.stats.update({"sglang:num_running_reqs": 0, "sglang:gen_throughput": 0, "sglang:num_queue_reqs": 0})
        self._log_stats(now)

    # -- tokenizer ----------------------------------------------------------------------------
    def request(self, stream, prompt_tokens, created):
        """A request (arrived at time.time() `created`) that starts running: its prefill."""
        self.prefill()
        return Request(self, stream, prompt_tokens, created)

    def _observe(self, name, split, value, count=1, total=None):
        buckets = next(b for n, _, b, _ in HISTOGRAMS if n == name)
        series = self.hists[name].setdefault(split, [[0] * (len(buckets) + 1), 0.0])
        series[1] += value if total is None else total
        i = next((i for i, b in enumerate(buckets) if value <= b), len(buckets))
        series[0][i] += count

    def _inc(self, name, split, value):
        self.counters[(name, split)] = self.counters.get((name, split), 0) + value

    # -- exposition ---------------------------------------------------------------------------
    def render(self, accept_encoding=""):
        """(body, Content-Type, Content-Encoding or None) of GET /metrics."""
        out = []
        with self.lock:
            self._maybe_log_idle()
            if self.published is not None:
                for name, help_text in SCHEDULER_GAUGES:
                    out.append(header(name, help_text, "gauge") + sample(name, self.sched_labels, self.published[name]))
            if self.graph_passes:
                out.append(header("sglang:cuda_graph_passes_total", GRAPH_PASSES_HELP, "counter"))
                out.extend(sample("sglang:cuda_graph_passes_total", dict(self.sched_labels, mode=m), n)
                           for m, n in sorted(self.graph_passes.items()))
            for name, help_text, split in COUNTERS:
                keys = [k for k in (("false", "true") if split else (None,)) if (name, k) in self.counters]
                if keys:
                    out.append(header(name + "_total", help_text, "counter"))
                    out.extend(sample(name + "_total", self._tok(k), self.counters[(name, k)]) for k in keys)
            for name, help_text, buckets, _ in HISTOGRAMS:
                series = self.hists[name]
                if series:
                    out.append(header(name, help_text, "histogram"))
                for k in sorted(series, key=str):
                    counts, total = series[k]
                    labels = self._tok(k)
                    out.append(sample(name + "_sum", labels, total))
                    acc = 0
                    for bound, n in zip(buckets + [math.inf], counts):
                        acc += n
                        out.append(sample(name + "_bucket", dict(labels, le=go_float(bound)), acc))
                    out.append(sample(name + "_count", labels, acc))
        body = "".join(out).encode()
        if any(e.split(";")[0].strip().lower() == "gzip" for e in (accept_encoding or "").split(",")):
            return gzip.compress(body), CONTENT_TYPE, "gzip"
        return body, CONTENT_TYPE, None

    def _tok(self, is_streaming):
        return self.tok_labels if is_streaming is None else dict(self.tok_labels, is_streaming=is_streaming)


class Request:
    """One request's tokenizer-side state (ReqState's time_stats, ttft_observed, last_completion_tokens)."""

    def __init__(self, metrics, stream, prompt_tokens, created):
        self.m, self.stream, self.prompt_tokens, self.created = metrics, bool(stream), prompt_tokens, created
        self.split = "true" if self.stream else "false"
        self.first_token_time = self.last_time = None
        self.last_tokens = 0

    def step(self, tokens, made, finished, streamed, verify_ct):
        """After a verify step that made `tokens` (`made` so far): the scheduler counts it, and
        sends an output batch to the tokenizer when the request's stream event went out
        (`streamed`), or, not streaming, every FORCE_STREAM_INTERVAL tokens and at its end."""
        m = self.m
        m.decode_step(tokens)
        now = time.time()
        if self.first_token_time is None:
            self.first_token_time = now  # the scheduler's prefill_finished_time
        out = streamed if self.stream else (finished or made % FORCE_STREAM_INTERVAL == 0)
        if not out:
            return
        with m.lock:
            if self.last_time is None:  # the first output batch
                first = now if self.stream else self.first_token_time
                m._observe("sglang:time_to_first_token_seconds", self.split, first - self.created)
                self.last_time, self.last_tokens = now, made
            elif made > self.last_tokens:  # observe_inter_token_latency: the interval spread over the tokens
                new, interval = made - self.last_tokens, now - self.last_time
                m._observe("sglang:inter_token_latency_seconds", None, interval / new, count=new, total=interval)
                self.last_time, self.last_tokens = now, made
            if finished:  # observe_one_finished_request
                m._inc("sglang:prompt_tokens", self.split, self.prompt_tokens)
                m._inc("sglang:generation_tokens", self.split, made)
                if verify_ct > 0:
                    m._inc("sglang:spec_verify_calls", None, verify_ct)
                m._inc("sglang:num_requests", self.split, 1)
                m._observe("sglang:e2e_request_latency_seconds", self.split, now - self.created)
