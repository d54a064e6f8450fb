"""spec-bench's load client (specops/agent/bench/specbench.py) against a streaming server on loopback
that answers as SGLang's /generate does with stream=true (srt/entrypoints/http_server.py:
`data: <json>` events, chunked, then `data: [DONE]`; meta_info carries completion_tokens and,
with speculation on, spec_verify_ct / spec_accept_length / spec_accept_rate).  No fleet needed."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specops import protocol
from specops.agent.bench import specbench
from support.perf import speed

STEP, TOKENS_PER_STEP = 0.002, 3


class Generate(BaseHTTPRequestHandler):
    """Each verify step makes TOKENS_PER_STEP tokens; an event goes out as SGLang's scheduler sends
    one at --stream-interval `interval` (scheduler_components/output_streamer.py): after every step
    at 1; at N > 1 when the output's length is k*N + 1, and at the end."""
    protocol_version = "HTTP/1.1"
    interval = 1

    def log_message(self, *a):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != "Bearer k3y":
            body = b'{"error": "Unauthorized"}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        assert req["stream"] is True and req["sampling_params"]["temperature"] == 0
        n = req["sampling_params"]["max_new_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        made = steps = 0
        while made < n:
            time.sleep(STEP)
            made, steps = min(n, made + TOKENS_PER_STEP), steps + 1
            if made < n and made % self.interval != (1 if self.interval > 1 else 0):
                continue
            meta = {"completion_tokens": made, "spec_verify_ct": steps, "spec_accept_length": made / steps,
                    "spec_accept_rate": 0.5}
            self._chunk(b"data: " + json.dumps({"text": "x" * made, "meta_info": meta}).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def serve(handler):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, protocol.ServiceCheck(name="sglang", port=srv.server_address[1])


@pytest.fixture
def server():
    srv, svc = serve(Generate)
    yield svc
    srv.shutdown()


def test_a_level_is_measured_from_raw_streamed_timings(server):
    results, wall = specbench.level(server, "k3y", ["a", "b", "c"], 4, 12, 30, seed=1)
    figures = specbench.summary(results, wall)
    assert figures["requests"] == 12 and figures["failed"] == 0
    assert all(r["completion_tokens"] == 30 and len(r["events"]) == 10 for r in results)
    assert figures["output_tok_s"] == pytest.approx(12 * 30 / wall, rel=0.01)
    assert figures["accept_length"] == pytest.approx(3.0) and figures["accept_rate"] == 0.5
    assert STEP * 0.9 <= figures["ttft_p50"] <= figures["ttft_p99"] <= wall  # no clock bound: a loaded box is slow
    # ITL is per token: each event's gap is shared by the tokens it brought (3 here), whatever the
    # machine's load does to the sleeps; so it is the raw gaps' median divided by 3.
    gaps = sorted(t2 - t1 for r in results for (t1, _), (t2, _) in zip(r["events"], r["events"][1:]))
    assert figures["itl_p50"] == pytest.approx(gaps[len(gaps) // 2] / TOKENS_PER_STEP, rel=0.2)
    assert figures["itl_p50"] >= STEP / TOKENS_PER_STEP * 0.9


def test_the_accept_length_is_sglangs_own_count_when_an_event_carries_several_steps():
    """Issue 24 item 4.  At --stream-interval 4, 30 tokens made 3 a step come in 3 events, after
    the steps that reach 9 and 21 tokens and at the end: the accept length is completion tokens ÷
    spec_verify_ct (10 steps: 3.0), whatever the events; tokens ÷ events would say 10."""
    srv, svc = serve(type("Generate4", (Generate,), {"interval": 4}))
    try:
        results, wall = specbench.level(svc, "k3y", ["a", "b"], 2, 6, 30, seed=1)
    finally:
        srv.shutdown()
    figures = specbench.summary(results, wall)
    assert figures["failed"] == 0
    assert all([n for _, n in r["events"]] == [9, 12, 9] and r["spec_verify_ct"] == 10 for r in results), results
    assert figures["accept_length"] == pytest.approx(3.0)
    # ITL is still per token: an event's gap is shared by the tokens it brought (12, then 9)
    assert figures["itl_p50"] >= STEP / TOKENS_PER_STEP * 0.9


def test_failures_are_counted_not_hidden(server):
    results, wall = specbench.level(server, "wrong", ["a"], 2, 4, 10, seed=0)
    figures = specbench.summary(results, wall)
    assert figures["failed"] == 4 and results[0]["error"] == "HTTP 401"


def test_without_speculation_no_accept_length_is_made_up():
    raw = [{"error": None, "completion_tokens": 10, "events": [[0.1, 5], [0.2, 5]]}]
    figures = specbench.summary(raw, 1.0)
    assert "accept_length" not in figures and figures["output_tok_s"] == 10.0
    assert figures["itl_p50"] == pytest.approx(0.02)


def test_the_prompt_order_is_fixed_by_the_seed(server, monkeypatch):
    seen = []
    monkeypatch.setattr(specbench, "one", lambda svc, key, prompt, n: seen.append(prompt) or
                        {"error": None, "completion_tokens": 1, "events": [[0.0, 1]]})
    prompts = [str(i) for i in range(20)]
    specbench.level(server, None, prompts, 1, 20, 1, seed=7)
    first, seen[:] = list(seen), []
    specbench.level(server, None, prompts, 1, 20, 1, seed=7)
    assert seen == first and sorted(first) == sorted(prompts) and first != prompts


def test_the_verdict_is_one_plain_line():
    from specops.flows.specbench import verdict
    assert verdict({1: 1.84, 8: 1.12, 32: 0.71}) == \
        "speculative decoding: 1.84x at concurrency 1, 1.12x at 8, 0.71x at 32: slower from 32 on"
    assert verdict({1: 0.61}) == "speculative decoding: 0.61x at concurrency 1: slower at every level"
    assert verdict({1: 0.9, 8: 1.2, 32: 1.1}).endswith(": slower at 1")


def test_the_report_page_holds_the_recorded_figures_and_nothing_from_outside():
    from html.parser import HTMLParser
    from specops.output import perfpage
    perf = {**speed(120.0, 90.0, accept=3.1), "at": "2026-12-03T16:00:00Z", "verdict": "speculative decoding: 1.33x"}
    perf["spec"] += [{"concurrency": 8, "figures": {"output_tok_s": 300.5, "accept_length": 2.9}}]
    perf["baseline"] += [{"concurrency": 8, "figures": {"output_tok_s": 310.0}}]
    perf["speedup"]["8"] = 0.969
    perf["accept_length"] = {"1": 3.1, "8": 2.9}
    releases = [{"stamp": "20261203T150000Z", "status": "deployed", "current": False, "summary": "first", "perf": None},
                {"stamp": "20261203T160000Z", "status": "deployed", "current": True, "summary": "<b>x</b>",
                 "perf": {"sglang": perf}, "verify": [{"name": "sglang", "intended": {"speculative_num_steps": 3}}],
                 "verified": [{"name": "sglang", "checks": ["/server_info speculative_num_steps = 3"],
                               "generate": {"completion_tokens": 16, "tok_s": 80.1,
                                            "spec_accept_length": 2.909090909090909}}]}]
    text = perfpage.page([perfpage.service_section("t1", "sglang", releases, {"min_speedup": 1.0})])

    class Read(HTMLParser):
        def __init__(self):
            super().__init__()
            self.cells, self.tags, self.refs = {}, set(), []

        def handle_starttag(self, tag, attrs):
            self.tags.add(tag)
            a = dict(attrs)
            self.refs += [v for k, v in attrs if k in ("src", "href") and v]
            if "data-tok-s" in a:
                self.cells[int(a["data-concurrency"])] = float(a["data-tok-s"])
    r = Read()
    r.feed(text)
    assert r.cells == {1: 120.0, 8: 300.5}
    assert 'data-speedup="0.969"' in text and 'data-accept-length="3.1"' in text
    assert "script" not in r.tags and "link" not in r.tags and "img" not in r.tags and not r.refs
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text  # what hosts say is escaped
    # tok/s lines (baseline dashed), accept length bars, speedup bars with the gate's line at 1.0
    assert text.count("<svg") == 3 and "stroke-dasharray" in text and ">gate 1.0</text>" in text
    assert "<li data-verified>/server_info speculative_num_steps = 3</li>" in text and "80.1 tok/s" in text
    assert "80.1 tok/s, accept length 2.91</li>" in text  # issue 38: two decimals, never 2.909090909090909


def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))
    assert specbench.percentile(values, 50) == 50 and specbench.percentile(values, 99) == 99
    assert specbench.percentile([5.0], 99) == 5.0 and specbench.percentile([], 50) is None


def test_a_zero_token_event_does_not_lose_its_time():
    raw = [{"error": None, "completion_tokens": 4, "events": [[0.1, 2], [0.15, 0], [0.3, 2]]}]
    assert specbench.summary(raw, 1.0)["itl_p50"] == pytest.approx(0.1)


@pytest.mark.parametrize("body, error", [
    (b"data: {\"error\": \"boom\"}\n\n", "the server: boom"),
    (b"data: [1, 2]\n\n", "not a JSON object"),
    (b"data: {\"meta_info\": {\"completion_tokens\": 3}}\n\n", "the stream ended without [DONE]"),
])
def test_a_bad_stream_is_a_failed_request_not_a_dead_client(body, error):
    class Odd(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        svc = protocol.ServiceCheck(name="sglang", port=srv.server_address[1])
        results, wall = specbench.level(svc, None, ["a"], 2, 3, 8, seed=0)
        assert len(results) == 3 and all(error in r["error"] for r in results), results
    finally:
        srv.shutdown()


def test_a_state_verified_twice_is_said_once_in_the_recap():
    """Issue 24 (a new user's rough edge): after `deploy --bench`, whose baseline restarts and verifies
    the service again, the recap said "sglang verified; sglang verified"."""
    from specops.output.report import ROLLED_BACK, HostReport
    r = HostReport("t4")
    for note in ("sglang verified", "small verified", "sglang verified", "release 1", ROLLED_BACK,
                 "sglang verified", "sglang verified"):
        r.note_once(note)
    assert r.notes == ["sglang verified", "small verified", "release 1", ROLLED_BACK, "sglang verified"]


def test_the_baseline_runs_without_speculation_or_is_refused():
    from types import SimpleNamespace
    from sandbox.provision import sandbox_service
    from specops.errors import SpecopsError
    from specops.flows.transient import plain_argv
    run = SimpleNamespace(host={})
    argv = plain_argv(run, sandbox_service(extra_args=["--mem-fraction-static", "0.8"]))
    assert "--model-path" in argv and "--mem-fraction-static" in argv
    assert not [a for a in argv if a.startswith("--speculative")]
    with pytest.raises(SpecopsError, match="--speculative-num-steps in extra_args"):
        plain_argv(run, sandbox_service(extra_args=["--speculative-num-steps", "2"]))


def test_a_level_stops_when_the_port_is_no_longer_the_services(server):
    """The key goes out only while the unit holds the port: asked before every connection."""
    asked, stopped = [], []

    def guard():
        asked.append(1)
        return "port 1: served by pid 9 (user mallory), not by sglang" if len(asked) > 3 else None
    results, _ = specbench.level(server, "k3y", ["a"], 2, 40, 6, seed=0, guard=guard, stopped=stopped)
    assert len(results) == 3 and stopped and "mallory" in stopped[0]


def test_a_level_stops_when_the_server_goes_away():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    stopped = []
    results, _ = specbench.level(protocol.ServiceCheck(name="sglang", port=port), None, ["a"], 4, 100, 6, seed=0,
                                 stopped=stopped)
    assert len(results) <= 4 and "stopped taking connections" in stopped[0]


def test_a_chat_chunk_counts_its_usage_and_sglang_spec_details_only_with_speculation_on():
    """SGLang 0.5.23 (serving_chat.py) streams usage on every chunk with continuous_usage_stats and
    sglext.spec_tokens_details in a chunk of its own; a verify count of 0 means no speculation."""
    assert specbench.chat_event({"choices": [], "usage": {"completion_tokens": 7}}) == (7, {})
    details = {"spec_verify_ct": 3, "spec_accept_length": 2.5}
    assert specbench.chat_event({"choices": [], "sglext": {"spec_tokens_details": details}}) == (None, details)
    assert specbench.chat_event({"sglext": {"spec_tokens_details": {"spec_verify_ct": 0}}}) == (None, {})
    assert specbench.chat_event({"choices": [{"delta": {"content": "x"}}]}) == (None, {})


def test_verify_says_the_accept_length_with_two_decimals():
    """Issue 38: verify printed spec_accept_length 2.909090909090909."""
    from specops import inventory
    from specops.flows import verify
    from specops.output.report import HostReport
    said, generated = [], {"completion_tokens": 32, "tok_s": 80.1, "spec_verify_ct": 11,
                           "spec_accept_length": 2.909090909090909}

    class Run:
        host, report = inventory.Host("t1", {}), HostReport("t1")

        def say(self, text):
            said.append(text)

        def call(self, req, **kw):
            return protocol.VerifyResult(services=[protocol.ServiceReport(name="sglang", generate=generated)])
    verify.verify(Run(), [protocol.ServiceCheck(name="sglang", port=30000)])
    assert ("verify          sglang: /generate 32 tokens at 80.1 tok/s, spec_verify_ct 11, "
            "spec_accept_length 2.91") in said


def test_verify_on_the_host_names_a_low_accept_length_with_two_decimals(monkeypatch):
    from specops.agent.services import asking, service_http
    meta = {"completion_tokens": 32, "spec_verify_ct": 11, "spec_accept_length": 2.909090909090909}
    monkeypatch.setattr(asking, "call", lambda *a, **kw: (200, json.dumps({"meta_info": meta}).encode()))
    report = protocol.ServiceReport(name="sglang")
    service_http._generate(protocol.ServiceCheck(name="sglang", port=1, min_accept_length=3.0), report, None)
    assert report.failures == ["spec_accept_length 2.91 is below min_accept_length 3.0"]
