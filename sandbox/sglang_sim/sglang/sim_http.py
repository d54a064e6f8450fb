"""The simulated server's HTTP side: SGLang's endpoints with its status codes and JSON shapes
(launch_server.py's docstring says which), on a server listening where uvicorn would, and a rank
> 0's health check alone; the server's State, which its SIGTERM handling shares."""
import json
import logging
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang import sim_chat, sim_tokens
from sglang.srt.utils import auth
from sglang.version import __version__

log = logging.getLogger("sglang")
DEFAULT_MAX_NEW_TOKENS = 16  # the simulator's, when a request sets none (short: tests wait for it)


class State:
    ready = False
    exiting = False  # SIGTERM seen (SGLang's tokenizer_manager.gracefully_exit)
    started = time.time()
    verify_steps = 0
    perf = None  # sim_perf.Model, made in main()
    metrics = None  # sim_metrics.Metrics with --enable-metrics
    dump = None  # sim_dump.RequestDump, made in main(): off until /configure_logging names a folder


def stream_now(length, interval, finished):
    """Whether a streaming request's output goes out after this step: SGLang's rule (see the module
    docstring), `length` being the request's output tokens so far."""
    if finished:
        return True
    return length % interval == 1 if interval > 1 else length % interval == 0


def make_handler(args, model_module, model_config, capture):
    # model_code_version: the release the loaded model file is from (None: a file that does not
    # say, as a whole-file patch may not), so patched code of one release is told from another's
    info_extra = {"version": __version__, "model_code": model_module.MODEL_CODE,
                  "model_code_version": getattr(model_module, "FILE_VERSION", None),
                  "model_code_file": model_module.__file__, "aux_hidden_state_capture": capture}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            pass

        def _send(self, code, body=None, ctype="application/json", encoding=None):
            data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            if encoding:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self, method):
            if auth.allowed(method, self.path.split("?")[0], self.headers.get("Authorization"), args.api_key,
                            args.admin_api_key):
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate", "/ready"):
                return self._send(200 if State.ready and not State.exiting else 503)
            if path.startswith("/metrics"):  # mounted as ^/metrics(?P<path>.*)$, only with --enable-metrics
                if not State.metrics:
                    return self._send(404, {"detail": "Not Found"})
                return self._send(200, *State.metrics.render(self.headers.get("Accept-Encoding")))
            if not self._authorized("GET"):
                return
            if path in auth.ADMIN_OPTIONAL:
                return self.admin(path, {})
            if not State.ready:
                return self._send(503)
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{
                    "id": args.served_model_name, "object": "model", "created": int(State.started),
                    "owned_by": "sglang", "root": args.served_model_name,
                    "max_model_len": model_config.get("max_position_embeddings", 4096)}]})
            if path in ("/server_info", "/get_server_info"):
                state = {"last_gen_throughput": State.perf.tok_s}
                if State.verify_steps >= 40:  # SGLang reports it only after 40 decode steps
                    state["avg_spec_accept_length"] = State.perf.accept
                # as 0.5.23's build_server_info: every resolved argument, the keys among them
                body = {**args.resolved_dict(), "internal_states": [state], **info_extra}
                return self._send(200, body)
            if path == "/v1/loads":  # srt/entrypoints/v1_loads.py: one LoadSnapshot per DP rank
                now = time.time()
                core = {"timestamp": now, "dp_rank": 0, "num_running_reqs": State.perf.running,
                        "num_waiting_reqs": 0, "num_used_tokens": 0, "num_total_tokens": 0, "token_usage": 0.0,
                        "gen_throughput": State.perf.tok_s, "max_running_requests": 0, "utilization": 0.0}
                return self._send(200, {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now)),
                                        "version": __version__, "accelerator": "NVIDIA H100 80GB HBM3",
                                        "num_accelerators": args.tp_size, "loads": [core]})
            if path in ("/model_info", "/get_model_info"):
                return self._send(200, {"model_path": args.model_path, "served_model_name": args.served_model_name,
                                        "tokenizer_path": args.tokenizer_path, "is_generation": True,
                                        "model_type": model_config.get("model_type"),
                                        "architectures": model_config.get("architectures"), **info_extra})
            self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            if not self._authorized("POST"):
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self._send(400, {"error": "invalid JSON"})
            if self.path in auth.ADMIN_OPTIONAL:
                return self.admin(self.path, req)
            if self.path not in ("/generate", sim_chat.PATH):
                return self._send(404, {"detail": "Not Found"})
            if not State.ready:
                return self._send(503)
            if self.path == sim_chat.PATH:
                kept = sim_chat.serve(self, req, args.stream_interval)
                return kept and State.dump.finished(*kept)
            params = req.get("sampling_params") or {}
            n = params.get("max_new_tokens")
            interval = int(params.get("stream_interval") or args.stream_interval)
            created = time.time()
            ids = req.get("input_ids")  # token ids (sim_tokens.py) in place of text
            prompt = [int(i) for i in ids] if isinstance(ids, list) else str(req.get("text", ""))
            if not req.get("stream"):
                text, meta = self.generate(prompt, n, interval)
                self._send(200, {"text": text, "meta_info": meta})
            else:
                self.start_stream()  # SGLang's: server-sent events (as stream_now says), then [DONE]
                text, meta = self.generate(prompt, n, interval,
                                           lambda text, meta: self.event({"text": text, "meta_info": meta}))
                self.event(None)
            State.dump.finished(req, {"text": text, "meta_info": meta}, created)

        def admin(self, path, req):
            """The admin routes the sandbox plays: /configure_logging sets the request dump
            (sim_dump.py) and answers 200 with no body, as 0.5.23's; /update_weights_from_disk
            fails, as loading weights is beyond a stand-in; the others answer 200."""
            if path == "/configure_logging":
                log.info("Config logging: obj=%r", State.dump.configure(req if isinstance(req, dict) else {}))
                return self._send(200, b"")
            if path == "/update_weights_from_disk":
                return self._send(400, {"success": False, "message": "the sandbox loads no weights",
                                        "num_paused_requests": 0})
            return self._send(200, {"success": True})

        def generate(self, prompt, n, interval, emit=None):
            """One request of `n` tokens (None: DEFAULT_MAX_NEW_TOKENS) through the performance
            model: streaming (`emit` given), emit(text so far, meta_info) after each step whose
            output goes out (stream_now); the final (text, meta_info), SGLang's /generate ones."""
            n = DEFAULT_MAX_NEW_TOKENS if n is None else int(n)
            t0, made, verify_ct = time.time(), 0, 0
            prompt_tokens = sim_tokens.count(prompt)

            def meta(done):
                m = {
                    "id": "sim-%d" % int(t0 * 1000),
                    "finish_reason": {"type": "length", "length": n} if done else None,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": made,
                    "cached_tokens": 0,
                    "e2e_latency": time.time() - t0,
                }
                if args.speculative_algorithm and verify_ct:  # SGLang: only when spec_verify_ct > 0
                    proposed = verify_ct * (State.perf.num_draft_tokens - 1)
                    m.update(spec_verify_ct=verify_ct, spec_accept_length=made / verify_ct,
                             spec_accept_rate=(made - verify_ct) / proposed if proposed else 0.0,
                             spec_num_correct_drafts=made - verify_ct, spec_num_proposed_drafts=proposed)
                return m
            stream = emit is not None
            State.perf.begin()
            try:
                record = State.metrics and State.metrics.request(stream, prompt_tokens, t0)  # and its prefill
                for seconds, tokens in State.perf.steps(n, prompt):
                    time.sleep(seconds)
                    made, verify_ct = made + tokens, verify_ct + 1
                    out = stream and stream_now(made, interval, made == n)
                    if out:
                        emit(" tok" * made, meta(made == n))
                    if record:
                        record.step(tokens, made, made == n, out, verify_ct if args.speculative_algorithm else 0)
            finally:
                State.perf.end()
            if args.speculative_algorithm:
                State.verify_steps += verify_ct
            return " tok" * n, meta(True)

        def start_stream(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def event(self, body):
            """One server-sent event of a JSON `body`; None: the last, [DONE], and the stream's end."""
            if body is None:
                self._chunk(b"data: [DONE]\n\n")
                return self._chunk(b"")
            self._chunk(b"data: " + json.dumps(body).encode() + b"\n\n")

        def _chunk(self, data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


def http_server(host, port, handler):
    """A server listening where SGLang's uvicorn does for `--host` (asyncio's create_server): an
    IPv6 address (::1, ::) on an IPv6 socket; a name (localhost) at what it resolves to (uvicorn
    takes every address, this the first).  http.server alone takes IPv4 only."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    def server_bind(self):
        if family == socket.AF_INET6:  # asyncio's create_server: an IPv6 socket is IPv6-only
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        ThreadingHTTPServer.server_bind(self)
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "server_bind": server_bind})
    return server_class((host, port), handler)


def dummy_health_server(host, port):
    """SGLang 0.5.23's launch_dummy_health_check_server (srt/utils/common.py), run on ranks > 0:
    /ping, /health and /health_generate answer 200; nothing else is served."""
    class Health(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            code = 200 if self.path.split("?")[0] in ("/ping", "/health", "/health_generate") else 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()
    http_server(host, port, Health).serve_forever()
