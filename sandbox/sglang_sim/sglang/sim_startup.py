"""The sandbox server's start: loading weights, then capturing CUDA graphs, in a spawned child
process as SGLang's scheduler does them, writing what SGLang 0.5.23 writes, byte for byte: the
same tqdm with the same formats (carriage returns, no newline per update; a line ends only when a
bar is done) and the same log lines (docs/ARCHITECTURE.md lists each with its source).  Its GPU
memory grows shard by shard, as a real load's does.

Knobs (the environment): SGLANG_SIM_LOAD_DELAY, SGLANG_SIM_SHARDS, SGLANG_SIM_STALL_AFTER
(launch_server.py's docstring).
"""
import json
import logging
import multiprocessing
import os
import sys
import time

from tqdm import tqdm

from sglang.srt.model_loader import loader

# sglang/srt/utils/common.py
BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"
CAPTURE_BS = [1, 2, 4, 8]  # captured largest first (decode_cuda_graph_runner.py: reversed)
GPU_TOTAL_GB = 79.10


def load(seconds, shards, speculative, registry, gpus):
    """Block until the child has loaded and captured; exit as it did when it failed."""
    if not shards:
        loader.load_model()  # a release that fails to load raises here (versions/0.5.25)
        time.sleep(seconds)
        return
    child = multiprocessing.get_context("spawn").Process(
        target=_scheduler, args=(seconds, shards, speculative, registry, gpus), name="sglang::scheduler")
    child.start()
    child.join()
    if child.exitcode:
        sys.exit(child.exitcode)


def _scheduler(seconds, shards, speculative, registry, gpus):
    # configure_logger(server_args, prefix=" TP0"), as SGLang's scheduler calls it (stderr)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s TP0] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)
    log = logging.getLogger("sglang.srt.model_executor.model_runner")
    stall = int(os.environ.get("SGLANG_SIM_STALL_AFTER", "-1"))
    per_shard_mb = int(os.environ.get("SGLANG_SIM_SHARD_MB", "500"))
    avail = lambda used_mb: GPU_TOTAL_GB - used_mb / 1024.0  # noqa: E731
    loader.load_model()  # as in load(): the child dies with the traceback, and the server with it
    log.info("Load weight begin. avail mem=%.2f GB", avail(0))
    t0, used = time.time(), 0
    for i in tqdm(range(shards), desc="Loading safetensors checkpoint shards", bar_format=BAR_FORMAT,
                  position=tqdm._get_free_pos()):
        if i == stall:
            while True:  # a hung load: no line, no growth, alive
                time.sleep(3600)
        time.sleep(seconds * 0.8 / shards)
        used += per_shard_mb
        _hold(registry, gpus, used)
    log.info("Load weight end. elapsed=%.2f s, type=LlamaForCausalLM, quant=None, avail mem=%.2f GB, "
             "mem usage=%.2f GB.", time.time() - t0, avail(used), used / 1024.0)
    logging.getLogger("sglang.srt.mem_cache.kv_cache_configurator").info(
        "Memory pool end. avail mem=%.2f GB", avail(used)
    )
    graphs = logging.getLogger("sglang.srt.model_executor.model_runner_components.cuda_graph_setup")
    name = "target verify" if speculative else "target decode"
    per_token = 4 if speculative else 1
    graphs.info("Capture %s CUDA graph begin. backend=full, num_tokens_per_req=%d, avail mem=%.2f GB",
                name, per_token, avail(used))
    t1 = time.time()
    bar = tqdm(list(reversed(CAPTURE_BS)))
    for bs in bar:
        bar.set_description("Capturing batches (bs=%d avail_mem=%.2f GB)" % (bs, avail(used)))
        time.sleep(seconds * 0.2 / len(CAPTURE_BS))
    graphs.info("Capture %s CUDA graph end. bs=%s, elapsed=%.2f s, mem usage=0.09 GB, avail mem=%.2f GB.",
                name, CAPTURE_BS, time.time() - t1, avail(used) - 0.09)
    # This child ends here (the server holds its own memory): nothing of it stays for a later pid.
    try:
        os.unlink(os.path.join(registry, "%d.json" % os.getpid()))
    except OSError:
        pass


def _hold(registry, gpus, mib):
    """What a CUDA allocation does for nvidia-smi: this process now holds `mib` per GPU."""
    path = os.path.join(registry, "%d.json" % os.getpid())
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "gpus": gpus, "label": "sglang::scheduler", "used_memory": mib}, f)
    os.replace(path + ".tmp", path)
