"""python -m sglang.launch_server: the sandbox server.

It resolves its arguments like SGLang, imports the model module for the
target's architecture (so tests see which code really loaded), registers its
processes as GPU compute apps for the nvidia-smi stand-in, and serves SGLang's
endpoints with SGLang's status codes and JSON shapes.

Behaviour knobs, from the environment (the flags stay SGLang's own):
  SGLANG_SIM_LOAD_DELAY     seconds "loading weights" before the HTTP port is bound (default 0:
                            real SGLang binds it only after the model is loaded)
  SGLANG_SIM_STARTUP_DELAY  seconds after binding before ready (default 1)
  SGLANG_SIM_SHARDS         a chatty load: the load delay, in a spawned child (SGLang's scheduler),
                            writes SGLang's own start-up lines and tqdm bars (sim_startup.py): a
                            redraw per weight shard, then the CUDA graph capture (default 0)
  SGLANG_SIM_STALL_AFTER    with SHARDS: hang silently, for ever, after this many shards
  SGLANG_SIM_SHARD_MB       with SHARDS: GPU memory the load takes per shard (default 500)
  SGLANG_SIM_TOK_S, SGLANG_SIM_BATCH_COST, SGLANG_SIM_ACCEPT_RATE, SGLANG_SIM_TREE_GAIN,
  SGLANG_SIM_ACCEPT_LENGTH, SGLANG_SIM_DRAFT_COST,
  SGLANG_SIM_VERIFY_COST    the performance model: how long /generate takes (sim_perf.py); a
                            draft's config.json may carry its own "sim_accept_rate" and
                            "sim_tree_gain" (sim_perf.py: acceptance is the draft's)
  SGLANG_SIM_WARMUP_REQUESTS, SGLANG_SIM_WARMUP_SECONDS
                            the first N requests after a start (default 0) each pay that many more
                            seconds (default 0.5) before their first token (sim_perf.py)
  SGLANG_SIM_NOISE, SGLANG_SIM_NOISE_STARTS, SGLANG_SIM_SLOW_FILE
                            opt-in noise: a speed drawn once per start (jitter, a random slow
                            start), and slow starts planted for given settings (sim_noise.py)
  SGLANG_SIM_ACCEPT_FILE    a file (default /run/sglang-sim/accept_rate): while it holds a float,
                            that replaces SGLANG_SIM_ACCEPT_RATE for requests starting after it
                            changed; removing it restores the knob (traffic drifting away from
                            what the draft was trained on, while the server runs: sim_perf.py)
  SGLANG_SIM_ORPHAN         "ignore-term": scheduler children (one per TP rank, titled
                            like SGLang's: sglang::scheduler, sglang::scheduler_TP0, ...)
                            that ignore SIGTERM; "escape": they also leave the cgroup
  SGLANG_SIM_GPU_MEM_MB     memory each process holds per GPU (default 1000)
  SGLANG_SIM_FAIL_WITHOUT_SPEC  exit at start when run without speculation (a baseline that fails)
  SGLANG_SIM_STOP_SECONDS   seconds a server takes to shut down once it stops serving (default 0),
                            as a real one frees its CUDA contexts; a peer rank lost meanwhile
                            still takes it down with a failure.  A comma-separated list gives
                            node rank i its i-th entry
  SGLANG_SIM_STOP_EXIT      the status a server exits with at the end of that shutdown (default 0):
                            non-zero is a crash while being stopped (an exception as it tears
                            down).  A comma-separated list gives node rank i its i-th entry

Streaming (/generate with stream=true) follows SGLang's --stream-interval N (default 1), or the
request's sampling_params.stream_interval, as its scheduler applies it
(srt/managers/scheduler_components/output_streamer.py, _GenerationStreamAccumulator.accept; the
same rule in scheduler_output_processor_mixin.py before that): after a step, an unfinished
request's output goes out when len(output_ids) % N == 0 at N = 1 (every step), and when
len(output_ids) % N == 1 at N > 1; a finished one's always.  A speculative step adds several
tokens, so at N > 1 one event carries several verify steps (a length that steps over k*N + 1 sends
nothing); meta_info's completion_tokens and spec_verify_ct are the request's counts at that moment.
(Real SGLang's prefill makes the first token alone, length 1, which always goes out; here the
first step is already a decode step, so at N > 1 the first event can come later than a real one.)

SIGTERM is SGLang 0.5.23's (srt/managers/tokenizer_manager.py, SignalHandler and
sigterm_watchdog): it only marks the server as exiting (/health, /health_generate and /ready
answer 503 at once, and every other request is still served, new ones too); a watchdog that
wakes every 5 s then exits once no request is in flight, checking again every 5 s.  With
SGL_FORCE_SHUTDOWN true in the process's environment when the watchdog looks (os.getenv, at
that moment), it exits without waiting for the requests.
  SGLANG_SIM_PEER_LOSS      "hang": a rank whose peer is gone hangs in its collective (until
                            NCCL's watchdog, minutes later) instead of exiting at once
  SGLANG_SIM_GPU_REGISTRY   where processes register as GPU compute apps (default
                            /run/sglang-sim/gpu, what the nvidia-smi stand-in reads): a test that
                            runs the server outside a sandbox host points it elsewhere

POST /v1/chat/completions is SGLang's OpenAI chat endpoint, on the same generation loop as
/generate (sim_chat.py).

With --enable-metrics, GET /metrics serves SGLang's Prometheus metrics from the requests' and steps'
own counts (sim_metrics.py); without it, 404.  It never needs the API key, nor do /health* and
/ready* (srt/utils/auth.py).

Releases: the package index carries several (sandbox/provision.py SIM_VERSIONS), built from this
tree with each one's overlay (versions/README.md); the shared code never asks which it is.
"""
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import setproctitle

from sglang import sim_chat, sim_dump, sim_metrics, sim_noise, sim_startup, sim_tokens
from sglang.sim_perf import Model, with_draft
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils import auth
from sglang.version import __version__

GPU_REGISTRY = os.environ.get("SGLANG_SIM_GPU_REGISTRY", "/run/sglang-sim/gpu")
ARCH_MODULES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v2"}
# configure_logger (srt/utils/common.py): stderr, where its tqdm bars go too
logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
log = logging.getLogger("sglang")
DEFAULT_MAX_NEW_TOKENS = 16  # the simulator's, when a request sets none (short: tests wait for it)


def visible_gpus():
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [int(g) for g in visible.split(",") if g.strip()] if visible else [0]


def register_gpu(pid, label, rank=None):
    """What a CUDA context does for nvidia-smi: this pid now holds memory on every visible GPU
    (the server), or on its rank's GPU (a scheduler)."""
    os.makedirs(GPU_REGISTRY, exist_ok=True)
    gpus = visible_gpus()
    if rank is not None:
        gpus = [gpus[rank % len(gpus)]]
    with open(os.path.join(GPU_REGISTRY, "%d.json" % pid), "w") as f:
        json.dump({"pid": pid, "gpus": gpus, "label": label,
                   "used_memory": int(os.environ.get("SGLANG_SIM_GPU_MEM_MB", "1000"))}, f)


def spawn_scheduler(mode, rank, tp_size):
    pid = os.fork()
    if pid:
        return pid
    # The child: a "scheduler" process that outlives its parent (sglang #4080 and others).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "escape":
        # Leave the unit's cgroup as a process handed to another manager does: systemd moves it
        # into a scope of its own (StartTransientUnit with its PID, what logind does for a
        # session), and systemctl stop no longer reaches it.  The hardened unit's read-only
        # cgroup tree leaves this way open to a root service, as on a real host.
        import subprocess
        me = str(os.getpid())
        subprocess.run(["busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                        "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))",
                        "sglang-sim-orphan-%s.scope" % me, "fail", "1", "PIDs", "au", "1", me, "0"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)
    # SGLang's own title (srt/managers/scheduler.py): the rank suffix only when tp_size > 1.
    title = "sglang::scheduler" + ("_TP%d" % rank if tp_size > 1 else "")
    setproctitle.setproctitle(title)
    register_gpu(os.getpid(), title, rank)
    while True:
        time.sleep(3600)


class State:
    ready = False
    exiting = False  # SIGTERM seen (SGLang's tokenizer_manager.gracefully_exit)
    started = time.time()
    verify_steps = 0
    perf = None  # sim_perf.Model, made in main()
    metrics = None  # sim_metrics.Metrics with --enable-metrics
    dump = None  # sim_dump.RequestDump, made in main(): off until /configure_logging names a folder


def draft_config(args):
    """The draft's config.json (None: no draft, or no such file)."""
    if not args.speculative_algorithm or not args.speculative_draft_model_path:
        return None
    try:
        with open(os.path.join(args.speculative_draft_model_path, "config.json")) as f:
            return json.load(f)
    except OSError:
        return None


def eagle3_capture_layers(args, model_config, module, draft):
    """As SGLang: layer ids only from the draft's nested eagle_config, captured at id + 1
    (index 0 is the embedding output); -1 needs a model file that captures embeddings."""
    if args.speculative_algorithm != "EAGLE3" or not args.speculative_draft_model_path:
        return None
    if draft is None:
        log.error("OSError: %s does not appear to have a file named config.json.",
                  args.speculative_draft_model_path)
        sys.exit(1)
    layers = model_config.get("num_hidden_layers", 32)
    ids = (draft.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = [2, layers // 2, layers - 3]
    if -1 in ids and not getattr(module, "CAPTURES_EMBEDDING", False):
        log.error("ValueError: eagle_aux_hidden_state_layer_ids contains -1, but %s cannot capture "
                  "the embedding output", module.__name__)
        sys.exit(1)
    capture = [i + 1 for i in ids]
    if max(capture) >= layers:
        log.error("IndexError: aux hidden state layer %d is out of range for %d layers", max(capture) - 1, layers)
        sys.exit(1)
    return capture


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
                m = {"id": "sim-%d" % int(t0 * 1000), "finish_reason": {"type": "length", "length": n} if done else None,
                     "prompt_tokens": prompt_tokens, "completion_tokens": made, "cached_tokens": 0,
                     "e2e_latency": time.time() - t0}
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
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
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


def shut_down_after(node_rank):
    """Exit after SGLANG_SIM_STOP_SECONDS with SGLANG_SIM_STOP_EXIT's status, 0 unless set (a rank
    > 0's SIGTERM handler, and the end of rank 0's drain); the join's watch threads keep running
    meanwhile."""
    seconds = os.environ.get("SGLANG_SIM_STOP_SECONDS", "0").split(",")
    codes = os.environ.get("SGLANG_SIM_STOP_EXIT", "0").split(",")

    def shut_down(*_):
        time.sleep(float(seconds[min(node_rank, len(seconds) - 1)]))
        code = int(codes[min(node_rank, len(codes) - 1)])
        if code:
            log.error("RuntimeError: an exception while shutting down (the sandbox's knob "
                      "SGLANG_SIM_STOP_EXIT): exiting with status %d", code)
        os._exit(code)
    return shut_down


WATCHDOG_SECONDS = 5  # tokenizer_manager.sigterm_watchdog's asyncio.sleep(5)


def sigterm(*_):
    """SignalHandler.sigterm_handler: mark the server as exiting; nothing else happens here."""
    log.warning("SIGTERM received. Draining requests and shutting down...")
    State.exiting = True


def sigterm_watchdog(shut_down):
    """TokenizerManager.sigterm_watchdog: wait for SIGTERM, then exit once no request is left, or at
    once when SGL_FORCE_SHUTDOWN is true (get_bool_env_var: "true" or "1", any case)."""
    while not State.exiting:
        time.sleep(WATCHDOG_SECONDS)
    while True:
        if os.getenv("SGL_FORCE_SHUTDOWN", "false").lower() in ("true", "1"):
            log.error("Signal SIGTERM received while force shutdown flag set. Force exiting.")
            break
        remaining = State.perf.running
        log.info("Gracefully exiting... Remaining number of requests %d.", remaining)
        if remaining == 0:
            break
        time.sleep(WATCHDOG_SECONDS)
    shut_down()


def join(args):
    """Across nodes, as torch.distributed's rendezvous does at --dist-init-addr: rank 0 waits until
    every other rank has joined; afterwards, any rank that goes takes the others down with it (a
    NCCL communicator does not survive a lost peer)."""
    import socket
    host, port = args.dist_init_addr.rsplit(":", 1)

    def watch(conn, who):
        try:
            conn.recv(1)  # nothing is ever sent: returns when the peer is gone
        except OSError:
            pass
        if os.environ.get("SGLANG_SIM_PEER_LOSS") == "hang":
            log.warning("%s left the communicator; waiting in a collective", who)
            return
        log.error("RuntimeError: NCCL error: %s left the communicator (connection to %s closed)", who,
                  args.dist_init_addr)
        os._exit(1)
    if args.node_rank == 0:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", int(port)))
        listener.listen(args.nnodes)
        log.info("Waiting for %d other node(s) to join at %s", args.nnodes - 1, args.dist_init_addr)
        for _ in range(args.nnodes - 1):
            conn, peer = listener.accept()
            rank = conn.recv(8).decode().strip()
            log.info("Node rank %s joined from %s", rank, peer[0])
            threading.Thread(target=watch, args=(conn, "node rank " + rank), daemon=True).start()
        listener.close()  # the group is complete: a rank that comes later finds no rendezvous here
        return
    deadline = time.time() + float(os.environ.get("SGLANG_SIM_JOIN_TIMEOUT", "600"))
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                log.error("RuntimeError: could not reach rank 0 at %s", args.dist_init_addr)
                sys.exit(1)
            time.sleep(0.5)
    conn.settimeout(None)
    conn.sendall(b"%-8d" % args.node_rank)
    log.info("Joined rank 0 at %s as node rank %d", args.dist_init_addr, args.node_rank)
    threading.Thread(target=watch, args=(conn, "node rank 0"), daemon=True).start()


def main(argv=None):
    args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    args.resolve_once()
    config_path = os.path.join(args.model_path, "config.json")
    try:
        with open(config_path) as f:
            model_config = json.load(f)
    except OSError:
        log.error("OSError: %s does not appear to have a file named config.json.", args.model_path)
        sys.exit(1)
    arch = (model_config.get("architectures") or ["LlamaForCausalLM"])[0]
    module = importlib.import_module("sglang.srt.models." + ARCH_MODULES.get(arch, "llama"))
    log.info("Loaded model code %s from %s (MODEL_CODE=%s, FILE_VERSION=%s)", module.__name__, module.__file__,
             module.MODEL_CODE, getattr(module, "FILE_VERSION", None))
    draft = draft_config(args)
    capture = eagle3_capture_layers(args, model_config, module, draft)
    State.dump = sim_dump.RequestDump(args)
    State.perf = Model(args.speculative_algorithm, args.speculative_num_steps, args.speculative_num_draft_tokens,
                       args.speculative_eagle_topk, env=with_draft(os.environ, draft))
    if args.enable_metrics:
        State.metrics = sim_metrics.Metrics(args, State.perf)
    if os.environ.get("SGLANG_SIM_FAIL_WITHOUT_SPEC") and not args.speculative_algorithm:
        log.error("RuntimeError: CUDA out of memory (the sandbox's knob: no start without speculation)")
        sys.exit(1)
    # As SGLang's engine does (entrypoints/engine.py): every resolved argument, the API key too.
    log.info("server_args=%s", args.resolved_dict())
    # Where the stand-in driver's nodes are (a sandbox host), what CUDA says when its user may not
    # open them; a unit test's local run has none.
    nodes = ["/dev/nvidiactl"] + ["/dev/nvidia%d" % g for g in visible_gpus()]
    denied = [d for d in nodes if not os.access(d, os.R_OK | os.W_OK)]
    if os.path.exists(nodes[0]) and denied:
        log.error("RuntimeError: No CUDA GPUs are available (%s: permission denied)", ", ".join(denied))
        sys.exit(1)
    register_gpu(os.getpid(), "sglang::server")
    orphan = os.environ.get("SGLANG_SIM_ORPHAN")
    if orphan:
        for rank in range(args.tp_size):
            log.info("Started scheduler pid %d", spawn_scheduler(orphan, rank, args.tp_size))
    sim_startup.load(float(os.environ.get("SGLANG_SIM_LOAD_DELAY", "0")), int(os.environ.get("SGLANG_SIM_SHARDS", "0")),
                     bool(args.speculative_algorithm), GPU_REGISTRY, visible_gpus())
    if args.nnodes > 1:
        join(args)
        if args.node_rank > 0:  # the other ranks run schedulers and a health check only
            signal.signal(signal.SIGTERM, shut_down_after(args.node_rank))
            dummy_health_server(args.host, args.port)
    # Drawn by a start that is about to serve: a planted slow start is not spent on one that failed
    State.perf.speed = sim_noise.start_speed(State.perf.settings)
    server = http_server(args.host, args.port, make_handler(args, module, model_config, capture))

    def ready_later():
        time.sleep(float(os.environ.get("SGLANG_SIM_STARTUP_DELAY", "1")))
        State.ready = True
        log.info("The server is fired up and ready to roll!")

    threading.Thread(target=ready_later, daemon=True).start()
    signal.signal(signal.SIGTERM, sigterm)
    threading.Thread(target=sigterm_watchdog, args=(shut_down_after(args.node_rank),), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
