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
import sys
import threading
import time

from sglang import sim_dump, sim_metrics, sim_noise, sim_startup
from sglang.sim_http import State, dummy_health_server, http_server, make_handler
from sglang.sim_perf import Model, with_draft
from sglang.sim_procs import GPU_REGISTRY, join, register_gpu, shut_down_after, spawn_scheduler, visible_gpus
from sglang.srt.server_args import prepare_server_args

ARCH_MODULES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v2"}
# configure_logger (srt/utils/common.py): stderr, where its tqdm bars go too
logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
log = logging.getLogger("sglang")


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
