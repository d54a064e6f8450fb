"""POST /v1/chat/completions: SGLang 0.5.23's OpenAI chat endpoint, on the simulator's generation
loop (sim_http.py's Handler.generate, /generate's: the same steps, API key, metrics, counts).

What it takes (srt/entrypoints/openai/protocol.py ChatCompletionRequest): `messages` (a non-empty
list; each message's content a string or a list of {"type": "text", "text"} parts), `model`
(optional: "default", echoed back), `max_completion_tokens` or else `max_tokens` (neither: the
simulator's default, sim_http.py DEFAULT_MAX_NEW_TOKENS), `stream`, `stream_options`
({include_usage, continuous_usage_stats}), `return_spec_tokens_details`; `temperature` and the rest
are accepted and change nothing.  The chat template is the server's: here the messages' contents
joined by newlines (the prompt's tokens are its words, as /generate counts them).  The
Content-Type must be application/json (validate_json_request).  Errors are SGLang's ErrorResponse
with status 400: a body the request model refuses (a simplified pydantic message, type "Bad
Request"), and "Messages cannot be empty." (type "BadRequestError", serving_chat._validate_request).

What it answers (serving_chat.py _generate_chat_stream and _build_chat_response, sse_utils.py
build_sse_content, utils.py should_include_usage and spec_tokens_details_from_meta_info):
  - streaming, as `data: <json>` events: at the first output, a chunk with delta {role:
    "assistant", content: ""}; then per output a chunk with delta {content: the new text}, and
    with `usage` (the request's counts so far) when continuous_usage_stats; after the last output
    a chunk with delta {} and finish_reason "length"; then, when return_spec_tokens_details and
    the request was speculative, a chunk with choices [] and sglext.spec_tokens_details (the
    SpecTokensDetails fields); then, when include_usage, a chunk with choices [] and the usage;
    then `data: [DONE]`.  Outputs go out as /generate's do (--stream-interval);
  - otherwise a chat.completion with the message, finish_reason, usage, metadata, and
    sglext.spec_tokens_details when asked (and speculative).
"""
import time

from sglang import sim_tokens

PATH = "/v1/chat/completions"
DEFAULT_MODEL = "default"  # protocol.py DEFAULT_MODEL_NAME
SPEC_DETAILS = (("spec_accept_rate", 0.0), ("spec_accept_length", 0.0), ("spec_cap_length", 0.0),
                ("spec_block_accept_length", 0.0), ("spec_num_correct_drafts", 0), ("spec_num_proposed_drafts", 0),
                ("spec_verify_ct", 0), ("spec_correct_drafts_histogram", []), ("spec_cap_lens_histogram", []))


def serve(handler, req, interval):
    """Answer one chat request on `handler` (launch_server's: ready and authorized already); what
    the request dump keeps of it (GenerateReqInput's fields, the output, when it came), or None."""
    problem = refused(handler.headers.get("Content-Type", ""), req)
    if problem:
        handler._send(400, problem)
        return None
    prompt = "\n".join(content_text(m.get("content")) for m in req["messages"])
    n = req.get("max_completion_tokens") or req.get("max_tokens")  # protocol.py to_sampling_params
    created = time.time()
    text, meta = (streamed if req.get("stream") else whole)(handler, req, prompt, n, interval, int(created))
    # what the request dump holds of it (serving_chat._engine_prompt): the templated prompt's ids
    return {"input_ids": sim_tokens.encode(prompt), "sampling_params": {"max_new_tokens": n},
            "stream": bool(req.get("stream"))}, {"text": text, "meta_info": meta}, created


def whole(handler, req, prompt, n, interval, created):
    """A chat.completion (_build_chat_response)."""
    text, meta = handler.generate(prompt, n, interval)
    body = {"id": meta["id"], "object": "chat.completion", "created": created,
            "model": req.get("model") or DEFAULT_MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None},
                         "logprobs": None, "finish_reason": meta["finish_reason"]["type"], "matched_stop": None}],
            "usage": usage(meta), "metadata": {"weight_version": "default"}}
    details = spec_details(meta) if req.get("return_spec_tokens_details") else None
    if details:
        body["sglext"] = {"spec_tokens_details": details}
    handler._send(200, body)
    return text, meta


def streamed(handler, req, prompt, n, interval, created):
    """chat.completion.chunk events, then [DONE] (_generate_chat_stream)."""
    options = req.get("stream_options") or {}

    def chunk(meta, choices, **extra):
        return dict({"id": meta["id"], "object": "chat.completion.chunk", "created": created,
                     "model": req.get("model") or DEFAULT_MODEL, "choices": choices}, **extra)

    def choice(delta, finish_reason=None):
        # msgspec's StreamDelta: reasoning_content always there (null), role and content only when set
        return [{"index": 0, "delta": dict({"reasoning_content": None}, **delta), "logprobs": None,
                 "finish_reason": finish_reason, "matched_stop": None}]
    sent = [0]  # characters of the text already sent (SGLang's stream_offsets)

    def emit(text, meta):
        if not sent[0]:
            handler.event(chunk(meta, choice({"role": "assistant", "content": ""})))
        delta, sent[0] = text[sent[0]:], len(text)
        if delta:
            extra = {"usage": usage(meta)} if options.get("continuous_usage_stats") else {}
            handler.event(chunk(meta, choice({"content": delta}), **extra))
    handler.start_stream()
    text, meta = handler.generate(prompt, n, interval, emit)
    if sent[0]:  # a finish reason is sent for a choice that streamed
        handler.event(chunk(meta, choice({}, meta["finish_reason"]["type"])))
    details = spec_details(meta) if req.get("return_spec_tokens_details") else None
    if details:
        handler.event(chunk(meta, [], usage=None, sglext={"spec_tokens_details": details}))
    if options.get("include_usage"):
        handler.event(chunk(meta, [], usage=usage(meta)))
    handler.event(None)
    return text, meta


def refused(content_type, req):
    """The ErrorResponse for a request SGLang refuses before generating, else None."""
    def error(message, kind="Bad Request"):
        return {"object": "error", "message": message, "type": kind, "param": None, "code": 400}
    if content_type.split(";")[0].strip().lower() != "application/json":
        return error("[{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only "
                     "'application/json' is allowed\", 'type': 'value_error'}]")
    if not isinstance(req, dict) or not isinstance(req.get("messages"), list):
        return error("1 validation error for ChatCompletionRequest\nmessages\n  Input should be a valid list")
    for i, m in enumerate(req["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                not isinstance(m.get("content"), (str, list, type(None))):
            return error("1 validation error for ChatCompletionRequest\nmessages.%d\n  Input should be a "
                         "message with a role and a content" % i)
    for key in ("max_completion_tokens", "max_tokens"):
        if req.get(key) is not None and (not isinstance(req[key], int) or isinstance(req[key], bool)):
            return error("1 validation error for ChatCompletionRequest\n%s\n  Input should be a valid integer" % key)
    if not req["messages"]:
        return error("Messages cannot be empty.", "BadRequestError")
    return None


def content_text(content):
    """A message's text: its content, or its text parts' joined."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def usage(meta):
    """UsageProcessor.calculate_token_usage, as UsageInfo dumps it (no cache report, no reasoning)."""
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}


def spec_details(meta):
    """spec_tokens_details_from_meta_info: SpecTokensDetails, or None when meta_info has no spec figure."""
    if not any(key in meta for key, _ in SPEC_DETAILS):
        return None
    return {key: meta.get(key) or default for key, default in SPEC_DETAILS}
