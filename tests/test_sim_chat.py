"""The simulator's OpenAI chat endpoint (sandbox/sglang_sim/sglang/sim_chat.py) as SGLang 0.5.23
answers it, spec-bench's load client sending chat prompts to it (specops/agent/bench/specbench.py),
a draft that carries its own acceptance, and a planted slow start seen from outside.  Each server
runs locally on a loopback port (support/sim.py: server); no fleet."""
import json
import urllib.error
import urllib.request

import pytest

from sandbox.oracle import sim_perf
from specops import protocol
from specops.agent.bench import specbench
from specops.agent.host import ActionError
from support.sim import KEY, SPEC, generate, scrape, server, tok, value

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "three more words"}]
SPEC_DETAILS = {"spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
                "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
                "spec_correct_drafts_histogram", "spec_cap_lens_histogram"}  # protocol.py SpecTokensDetails


def chat(base, body, key=KEY, content_type="application/json"):
    """(status, body) of one POST /v1/chat/completions; a stream's body as its events' data."""
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + key, "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    if not body.get("stream"):
        return 200, json.loads(raw)
    data = [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    assert data[-1] == "[DONE]", data[-1]
    return 200, [json.loads(d) for d in data[:-1]]


def test_a_streamed_chat_is_sglangs_chunks_in_sglangs_order(tmp_path):
    body = {"messages": MESSAGES, "model": "m1", "stream": True, "max_completion_tokens": 30, "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "return_spec_tokens_details": True}
    with server(tmp_path, *SPEC) as base:
        _, chunks = chat(base, body)
        _, plain = chat(base, {"messages": MESSAGES, "stream": True, "max_tokens": 30})
        meta, _ = generate(base, 30, True, words=5)  # the same request through /generate
    assert {(c["id"], c["object"], c["model"]) for c in chunks} == {(chunks[0]["id"], "chat.completion.chunk", "m1")}
    role, contents, finish, ext, usage = chunks[0], chunks[1:-3], chunks[-3], chunks[-2], chunks[-1]
    assert role["choices"] == [{"index": 0, "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None, "matched_stop": None}]
    assert "".join(c["choices"][0]["delta"]["content"] for c in contents) == " tok" * 30
    counts = [c["usage"]["completion_tokens"] for c in contents]
    assert counts == sorted(set(counts)) and counts[-1] == 30
    assert all(c["usage"]["prompt_tokens"] == 5 for c in contents)
    assert finish["choices"] == [{"index": 0, "delta": {"reasoning_content": None}, "logprobs": None,
                                  "finish_reason": "length", "matched_stop": None}]
    details = ext["sglext"]["spec_tokens_details"]
    assert ext["choices"] == [] and ext["usage"] is None and set(details) == SPEC_DETAILS
    assert details["spec_verify_ct"] == meta["spec_verify_ct"] == len(contents)  # a step an event (interval 1)
    assert details["spec_accept_length"] == pytest.approx(30 / meta["spec_verify_ct"])
    assert usage["choices"] == [] and "sglext" not in usage and usage["usage"] == {
        "prompt_tokens": 5, "total_tokens": 35, "completion_tokens": 30, "prompt_tokens_details": None,
        "reasoning_tokens": 0, "completion_tokens_details": None}
    # asked for nothing more: no usage on any chunk, no sglext chunk, no usage chunk; model "default"
    assert [c["choices"][0]["finish_reason"] for c in plain] == [None] * (len(plain) - 1) + ["length"]
    assert all("usage" not in c and c["model"] == "default" for c in plain)


def test_a_chat_without_streaming_the_refusals_and_the_metrics(tmp_path):
    with server(tmp_path, *SPEC, "--enable-metrics") as base:
        status, answer = chat(base, {"messages": MESSAGES, "max_tokens": 12, "return_spec_tokens_details": True})
        _, bare = chat(base, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]}],
                              "max_completion_tokens": 4})
        empty = chat(base, {"messages": []})
        wrong_key = chat(base, {"messages": MESSAGES}, key="nope")
        not_json = chat(base, {"messages": MESSAGES}, content_type="text/plain")
        _, _, samples = scrape(base)
    assert status == 200 and answer["object"] == "chat.completion" and answer["model"] == "default"
    assert answer["choices"] == [{"index": 0, "message": {"role": "assistant", "content": " tok" * 12,
                                                          "reasoning_content": None},
                                  "logprobs": None, "finish_reason": "length", "matched_stop": None}]
    assert answer["usage"]["completion_tokens"] == 12 and answer["metadata"] == {"weight_version": "default"}
    assert answer["sglext"]["spec_tokens_details"]["spec_verify_ct"] > 0
    assert "sglext" not in bare and bare["usage"]["prompt_tokens"] == 2
    assert empty == (400, {"object": "error", "message": "Messages cannot be empty.", "type": "BadRequestError",
                           "param": None, "code": 400})
    assert wrong_key[0] == 401 and not_json[0] == 400 and "application/json" in not_json[1]["message"]
    assert value(samples, "sglang:num_requests_total", **tok(is_streaming="false")) == 2  # the two that ran
    assert value(samples, "sglang:generation_tokens_total", **tok(is_streaming="false")) == 16


def test_the_load_client_measures_a_chat_as_it_measures_generate(tmp_path):
    """The same server, the same load, once as messages to the chat endpoint and once as text to
    /generate: the same events a request (tokens per event), the same verify steps, and the same
    accept length from SGLang's own counters, the model's (Leviathan's, alpha 0.8, a chain of 3)."""
    with server(tmp_path, *SPEC) as base:
        svc = protocol.ServiceCheck(name="sglang", port=int(base.rsplit(":", 1)[1]))
        specbench.check_prompts(svc, [{"messages": MESSAGES}, "text"])
        by_chat, chat_wall = specbench.level(svc, KEY, [{"messages": MESSAGES}], 2, 6, 40, seed=0)
        by_text, text_wall = specbench.level(svc, KEY, ["Be brief. three more words"], 2, 6, 40, seed=0)
    chat_figures, text_figures = specbench.summary(by_chat, chat_wall), specbench.summary(by_text, text_wall)
    assert chat_figures["failed"] == 0 == text_figures["failed"], by_chat[0]["error"]
    assert all(r["completion_tokens"] == 40 == sum(n for _, n in r["events"]) for r in by_chat + by_text)
    assert {tuple(n for _, n in r["events"]) for r in by_chat} == {tuple(n for _, n in r["events"]) for r in by_text}
    assert {r["spec_verify_ct"] for r in by_chat} == {r["spec_verify_ct"] for r in by_text}
    assert chat_figures["accept_length"] == pytest.approx(text_figures["accept_length"], rel=0.01)
    assert chat_figures["accept_length"] == pytest.approx((1 - 0.8 ** 4) / 0.2, rel=0.05)
    assert chat_figures["accept_rate"] == pytest.approx(text_figures["accept_rate"], rel=0.01)
    assert chat_figures["ttft_p50"] > 0 and chat_figures["itl_p50"] > 0
    with pytest.raises(ActionError, match="no chat endpoint"):
        specbench.check_prompts(protocol.replace(svc, endpoints=protocol.Endpoints(chat=None)), [{"messages": []}])


def test_a_draft_that_carries_its_acceptance_runs_with_it_and_the_oracle_follows(tmp_path):
    draft = {"sim_accept_rate": 0.5, "sim_tree_gain": 0.2}
    env = {"SGLANG_SIM_ACCEPT_RATE": "0.9", "SGLANG_SIM_TREE_GAIN": "0.7"}
    tree = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
            "--speculative-num-draft-tokens", "7"]
    with server(tmp_path, *tree, draft=draft, **env) as base:
        own = generate(base, 400, False)[0]["spec_accept_length"]
        (tmp_path / "accept_rate").write_text("0.1")  # the accept file still wins over the draft's
        drifted = generate(base, 400, False)[0]["spec_accept_length"]
    assert own == pytest.approx(sim_perf.accept_length(0.5, 0.2, 3, 2, 7), rel=0.02)
    assert own < 0.8 * sim_perf.accept_length(0.9, 0.7, 3, 2, 7)
    assert drifted == pytest.approx(sim_perf.accept_length(0.1, 0.2, 3, 2, 7), rel=0.02)
    settings = (3, 2, 7)
    assert sim_perf.steady_tok_s(sim_perf.with_draft(env, draft), 8, settings) == pytest.approx(
        sim_perf.steady_tok_s({"SGLANG_SIM_ACCEPT_RATE": "0.5", "SGLANG_SIM_TREE_GAIN": "0.2"}, 8, settings))
    assert sim_perf.with_draft(env, {"architectures": ["X"]}) == env  # a real draft: the knobs


def test_a_planted_slow_start_is_the_first_start_of_its_settings_only(tmp_path):
    """Two starts of the same settings with one slow start planted at 0.2: the first serves the same
    request about 5x slower than the second (2.5x at least, whatever a loaded box adds to a step)."""
    (tmp_path / "slow.json").write_text(json.dumps([{"settings": [3, 1, 4], "factor": 0.2, "starts": 1}]))
    seconds = []
    for _ in range(2):
        with server(tmp_path, *SPEC, SGLANG_SIM_TOK_S="100", SGLANG_SIM_ACCEPT_LENGTH="1") as base:
            seconds.append(generate(base, 20, False)[0]["e2e_latency"])
    assert seconds[0] > 2.5 * seconds[1], seconds
    assert json.loads((tmp_path / "slow.json").read_text())[0]["starts"] == 0
