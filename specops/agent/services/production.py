"""What a running SGLang server says of its production traffic: its /metrics (SGLang 0.5.23's
srt/observability/metrics_collector.py, on with --enable-metrics, no API key needed), read for
`inv status` in the same look as its arguments.

The figures: the accept length of its last decode-log window (sglang:spec_accept_length), its
generation throughput (sglang:gen_throughput), queued and running requests, and the counters
since it started (sglang:generation_tokens_total, sglang:spec_verify_calls_total): their ratio
is the accept length over its whole run, and the verify calls say whether there was traffic
enough to judge it.
"""
from specops.agent.services import asking

GAUGES = {"sglang:spec_accept_length": "accept_length", "sglang:gen_throughput": "gen_throughput",
          "sglang:num_queue_reqs": "queue", "sglang:num_running_reqs": "running"}
COUNTERS = {"sglang:generation_tokens_total": "generation_tokens", "sglang:spec_verify_calls_total": "verify_calls"}
MAX_BYTES = 4 << 20


def parse(text):
    """{name: [values]} of the exposition's samples (labels dropped)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        try:
            out.setdefault(name, []).append(float(value))
        except ValueError:
            continue
    return out


def figures(svc):
    """{accept_length, gen_throughput, queue, running, generation_tokens, verify_calls} (those it
    exports), or {"error": why} when /metrics cannot be read."""
    try:
        status, raw = asking.call(svc, "GET", svc.endpoints.metrics, timeout=5)
    except (OSError, ValueError) as e:
        return {"error": "no answer (%s)" % e}
    if status != 200:
        return {"error": "%s answered %s" % (svc.endpoints.metrics, status)}
    samples = parse(raw[:MAX_BYTES].decode(errors="replace"))
    out = {}
    for name, key in GAUGES.items():  # one per rank: the ranks' mean (queue and running: their sum)
        if samples.get(name):
            vals = samples[name]
            out[key] = sum(vals) if key in ("queue", "running") else sum(vals) / len(vals)
    for name, key in COUNTERS.items():
        if name in samples:
            out[key] = sum(samples[name])
    return out
