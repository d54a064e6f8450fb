"""The load client of spec-bench: drives a service on this host (the controller is not in the
data path) and measures what speculative decoding is worth.

Per concurrency level: a warm-up, then `requests` requests from `level` closed-loop clients, each
a streaming request of a fixed prompt (the prompts cycled in an order fixed by the seed) with
temperature 0 and `max_new_tokens`: a text prompt to /generate, a {"messages": [...]} prompt to
the OpenAI chat endpoint (SGLang's /v1/chat/completions, asked for its usage on every chunk and
its speculative counts at the end).  Per request it keeps the raw timings (start, first token,
each event's time and tokens, end) and SGLang's own speculative stats (spec_verify_ct,
spec_accept_length, spec_accept_rate: present only with speculation on), from the last event's
meta_info (/generate) or the sglext.spec_tokens_details chunk (chat): the same figures from
either.  Per level: output tok/s, requests/s, TTFT and inter-token latency p50/p99, and the
accept length (completion tokens ÷ verify steps, over the level).
"""
import json
import os
import random
import threading
import time

from specops import protocol
from specops.agent.services import http, listeners
from specops.agent.host import ActionError
from specops.agent.services.asking import api_key
from specops.agent.bench import dumpdir

SPEC_FIELDS = ("spec_verify_ct", "spec_accept_length", "spec_accept_rate")


def generate_request(svc, prompt, max_new_tokens):
    """A text prompt, or a traffic sample's {"text" | "input_ids", "max_new_tokens"}: (path, body)
    of SGLang's streaming /generate, and what its events say."""
    if isinstance(prompt, dict):
        key = "input_ids" if "input_ids" in prompt else "text"
        body = {key: prompt[key]}
        max_new_tokens = prompt.get("max_new_tokens") or max_new_tokens  # as the request that was served
    else:
        body = {"text": prompt}
    return svc.endpoints.generate, dict(body, stream=True, sampling_params={
        "max_new_tokens": max_new_tokens, "temperature": 0}), generate_event


def generate_event(chunk):
    """(completion tokens so far, spec figures) of a /generate event: its meta_info's."""
    meta = chunk.get("meta_info") or {}
    return meta.get("completion_tokens", 0), meta


def chat_request(svc, prompt, max_new_tokens):
    """A {"messages"} prompt: a streaming chat completion that reports its usage on every content
    chunk (the event's tokens) and SGLang's speculative counts in a chunk of its own."""
    return svc.endpoints.chat, {"messages": prompt["messages"], "stream": True, "max_completion_tokens": max_new_tokens,
                                "temperature": 0, "return_spec_tokens_details": True,
                                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, chat_event


def chat_event(chunk):
    """(completion tokens so far, or None: no usage in it; spec figures) of a chat chunk.  Every
    chunk's usage counts, whatever its delta carries (content, reasoning_content, tool_calls: a
    server with a reasoning parser streams no content for a while), and the final usage chunk
    brings tokens streamed with no text; spec_tokens_details counts only with speculation on (its
    verify count above 0), as /generate's meta_info has them only then."""
    if isinstance(chunk.get("usage"), dict):
        return chunk["usage"].get("completion_tokens", 0), {}
    details = (chunk.get("sglext") or {}).get("spec_tokens_details")
    return None, details if isinstance(details, dict) and details.get("spec_verify_ct") else {}


def one(svc, key, prompt, max_new_tokens, timeout=300):
    """One streaming request (chat for a {"messages"} prompt, else /generate): its raw timings,
    completion tokens and the server's speculative stats."""
    path, body, read = (chat_request if isinstance(prompt, dict) and "messages" in prompt
                        else generate_request)(svc, prompt, max_new_tokens)
    headers = {"Authorization": "Bearer " + key} if key else {}
    t0, events, last, done_seen = time.monotonic(), [], {"completion_tokens": 0}, []

    def on_event(data):
        if data == b"[DONE]":
            done_seen.append(True)
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise ValueError("an event that is not a JSON object")
        if "error" in chunk:
            err = chunk["error"]
            raise OSError("the server: %s" % (err.get("message", err) if isinstance(err, dict) else err))
        tokens, figures = read(chunk)
        if tokens is not None and tokens != last["completion_tokens"]:  # a chunk with no new token is no event
            events.append([round(time.monotonic() - t0, 6), tokens - last["completion_tokens"]])
            last["completion_tokens"] = tokens
        last.update((k, figures[k]) for k in SPEC_FIELDS if k in figures)
    try:
        status = http.stream(svc.host, svc.port, path, json.dumps(body).encode(), headers, on_event, timeout)
        error = None if status == 200 else "HTTP %s" % status
        if not error and not (done_seen and events):  # cut off, or not a stream at all
            error = "the stream ended without [DONE]" if events else "no event in the answer"
    except Exception as e:  # noqa: BLE001 (any failure is this request's, counted; the client goes on)
        error = ("%s: %s" % (type(e).__name__, e))[:200]
    out = {"start": t0, "end": round(time.monotonic() - t0, 6), "events": events, "error": error}
    out.update(last)
    return out


def level(svc, key, prompts, concurrency, requests, max_new_tokens, seed, guard=None, stopped=None):
    """`requests` requests from `concurrency` closed-loop clients; the level's raw results and wall
    time.  `guard()`, asked before every connection, says why the port must get nothing (else
    None); then, or when the server stops taking connections, the level stops and the reason is
    added to `stopped`."""
    order = random.Random(seed).sample(range(len(prompts)), len(prompts))
    todo, results, lock = list(range(requests)), [], threading.Lock()
    stopped = [] if stopped is None else stopped

    def client():
        while True:
            with lock:
                if not todo or stopped:
                    return
                i = todo.pop(0)
                problem = guard() if guard else None  # under the lock: the listener's cache is shared
                if problem:
                    stopped.append(problem)
                    return
            r = one(svc, key, prompts[order[i % len(order)]], max_new_tokens)
            with lock:
                results.append(r)
                if r["error"] and r["error"].startswith(("ConnectionRefusedError", "ConnectionResetError")):
                    stopped.append("the server stopped taking connections (%s)" % r["error"])
    t0 = time.monotonic()
    workers = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return results, time.monotonic() - t0


def percentile(values, p):
    """The nearest-rank percentile: the smallest value with at least p% of them at or below it."""
    if not values:
        return None
    values = sorted(values)
    rank = -(-p * len(values) // 100)  # ceil(p/100 * n)
    return values[max(int(rank), 1) - 1]


def summary(results, wall):
    """The figures of one level, from its raw results."""
    ok = [r for r in results if not r["error"]]
    tokens = sum(r["completion_tokens"] for r in ok)
    ttft = [r["events"][0][0] for r in ok if r["events"]]
    itl = []
    for r in ok:
        t_prev = r["events"][0][0] if r["events"] else 0
        for t, n in r["events"][1:]:
            if n:  # an event with no new token: its time counts toward the next token's gap
                itl += [(t - t_prev) / n] * n
                t_prev = t
    # SGLang's own count of verify steps, never the events: at --stream-interval N > 1 one event
    # carries several steps (an unfinished request's output goes out only at lengths k*N + 1)
    verify = sum(r.get("spec_verify_ct", 0) for r in ok)
    out = {"requests": len(results), "failed": len(results) - len(ok), "seconds": round(wall, 4),
           "output_tok_s": round(tokens / wall, 2) if wall else 0.0,
           "requests_s": round(len(ok) / wall, 3) if wall else 0.0,
           "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
           "itl_p50": percentile(itl, 50), "itl_p99": percentile(itl, 99)}
    if verify:
        rates = [r["spec_accept_rate"] for r in ok if "spec_accept_rate" in r]
        out.update(accept_length=round(tokens / verify, 3),
                   accept_rate=round(sum(rates) / len(rates), 3) if rates else None)
    return out


def sendable(p):
    """Whether `one()` can send prompt `p` (SpecBench's kinds)."""
    if isinstance(p, str):
        return True
    if not isinstance(p, dict):
        return False
    if "messages" in p:
        return isinstance(p["messages"], list)
    return (isinstance(p.get("text"), str) or (isinstance(p.get("input_ids"), list) and all(
        isinstance(i, int) for i in p["input_ids"]))) and (p.get("max_new_tokens") is None or isinstance(
            p["max_new_tokens"], int))


def check_prompts(svc, prompts):
    """Before any request: each prompt one `one()` can send to this service."""
    if not prompts:
        raise ActionError("spec-bench needs at least one prompt")
    for i, p in enumerate(prompts):
        if not sendable(p):
            raise ActionError('spec-bench: prompt %d is neither a string, {"messages": [...]}, nor a traffic '
                              'sample\'s {"text" | "input_ids"}' % i)
        if isinstance(p, dict) and "messages" in p and not svc.endpoints.chat:
            raise ActionError("spec-bench: %s has no chat endpoint for the prompts given as messages" % svc.name)


def run(req):
    """Answer a protocol.SpecBench: each level measured in turn (the controller asks for one level
    a request, and says its figures and the time left as each ends)."""
    svc, key = req.service, api_key(req.service.name)
    prompts = req.prompts
    if req.sample:  # a traffic sample on this host: the load's share of it, picked as a file's is
        prompts = protocol.sampled(dumpdir.read_sample(req.sample, req.sample_sha256), req.requests, req.seed)
    check_prompts(svc, prompts)
    levels = []
    # As verify does: whatever answers on the port gets the API key only if it is the unit's,
    # asked before every connection (a server that dies mid-level frees the port for anyone).
    guard = listeners.Listener(req.unit or svc.name, svc.port).problem
    for concurrency in req.concurrency:
        stopped = []
        level(svc, key, prompts, concurrency, min(req.warmup, req.requests) if req.warmup else 0,
              req.max_new_tokens, req.seed, guard, stopped)
        cpu = sum(os.times()[:2])
        if not stopped:
            results, wall = level(svc, key, prompts, concurrency, req.requests, req.max_new_tokens, req.seed,
                                  guard, stopped)
        if stopped:
            raise ActionError("%s:%d: %s; spec-bench stopped at concurrency %d" % (svc.host, svc.port, stopped[0],
                                                                                  concurrency))
        figures = summary(results, wall)
        figures["client_cpu_s"] = round(sum(os.times()[:2]) - cpu, 4)  # the load client's own cost
        if figures["failed"] == figures["requests"]:
            raise ActionError("spec-bench: every request at concurrency %d failed: %s"
                              % (concurrency, results[0]["error"] if results else "none ran"))
        levels.append(protocol.BenchLevel(concurrency=concurrency, figures=figures, raw=results))
    return protocol.SpecBenchResult(levels=levels)
