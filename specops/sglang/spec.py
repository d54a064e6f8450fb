"""A service's SGLang launch arguments: the intended values, and the argv that asks for them."""
from __future__ import annotations

from typing import Any

from ..inventory import reach

# service key → (flag, server_info field)
SERVER_FLAGS = [
    ("served_model_name", "--served-model-name", "served_model_name"),
    ("bind", "--host", "host"),
    ("port", "--port", "port"),
    ("tp", "--tp-size", "tp_size"),
    ("dp", "--dp-size", "dp_size"),
    ("mem_fraction_static", "--mem-fraction-static", "mem_fraction_static"),
    ("attention_backend", "--attention-backend", "attention_backend"),
    ("page_size", "--page-size", "page_size"),
    ("max_running_requests", "--max-running-requests", "max_running_requests"),
    ("device", "--device", "device"),
    # across nodes (derived by specops/inventory/multinode.py from `nodes`)
    ("nnodes", "--nnodes", "nnodes"),
    ("node_rank", "--node-rank", "node_rank"),
    ("dist_init_addr", "--dist-init-addr", "dist_init_addr"),
]
SPEC_FLAGS = [
    ("algorithm", "--speculative-algorithm", "speculative_algorithm"),
    ("draft_model_path", "--speculative-draft-model-path", "speculative_draft_model_path"),
    ("draft_model_revision", "--speculative-draft-model-revision", "speculative_draft_model_revision"),
    ("num_steps", "--speculative-num-steps", "speculative_num_steps"),
    ("eagle_topk", "--speculative-eagle-topk", "speculative_eagle_topk"),
    ("num_draft_tokens", "--speculative-num-draft-tokens", "speculative_num_draft_tokens"),
    ("ngram_max_bfs_breadth", "--speculative-ngram-max-bfs-breadth", "speculative_ngram_max_bfs_breadth"),
    ("dflash_block_size", "--speculative-dflash-block-size", "speculative_dflash_block_size"),
]


def launch_args(svc: dict) -> list[str]:
    """The arguments after `-m sglang.launch_server`, in a stable order."""
    args = ["--model-path", svc["model_path"]]
    values = {**svc, "port": reach.port(svc), "bind": reach.bind(svc)}
    for key, flag, _ in SERVER_FLAGS:
        if values.get(key) is not None:
            args += [flag, str(values[key])]
    spec = svc.get("speculative") or {}
    for key, flag, _ in SPEC_FLAGS:
        if spec.get(key) is not None:
            args += [flag, str(spec[key])]
    if metrics_on(svc):
        args.append(METRICS_FLAG)
    return args + list(svc.get("extra_args") or [])


# SGLang's Prometheus metrics (srt/observability/metrics_collector.py) are off unless asked for;
# specops asks unless the service says `metrics: false`.  /metrics needs no API key (utils/auth.py).
METRICS_FLAG = "--enable-metrics"


def metrics_on(svc: dict) -> bool:
    return svc.get("metrics", True) is not False


def said_as() -> dict[str, str]:
    """/server_info's field -> the inventory key that sets it, where they differ (verify's and the
    preflight's words: "num_draft_tokens (speculative_num_draft_tokens): intended 16, effective 2")."""
    return {field: key for key, _, field in SERVER_FLAGS + SPEC_FLAGS if key != field}


def intended(svc: dict) -> dict[str, Any]:
    """What /server_info should report for the fields specops sets."""
    out: dict[str, Any] = {"model_path": svc["model_path"], "port": reach.port(svc)}
    for key, _, field in SERVER_FLAGS:
        if svc.get(key) is not None:
            out[field] = svc[key]
    for key, _, field in SPEC_FLAGS:
        if (svc.get("speculative") or {}).get(key) is not None:
            out[field] = svc["speculative"][key]
    if metrics_on(svc):
        out["enable_metrics"] = True
    if "algorithm" in (svc.get("speculative") or {}) and out["speculative_algorithm"] == "NEXTN":
        out["speculative_algorithm"] = "EAGLE"
    return out

