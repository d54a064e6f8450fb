"""SGLang's server (`python -m sglang.launch_server`), the first kind of service.

Interface facts from SGLang 0.5.23's source (srt/entrypoints/http_server.py,
srt/managers/scheduler.py): /health is 503 while starting and needs no API key;
/server_info (or /get_server_info before it) reports every resolved argument at the
top level; /generate answers with meta_info; its children retitle themselves
`sglang::scheduler_TP0`, `sglang::detokenizer`, ...
"""
from __future__ import annotations

from .. import protocol
from ..errors import UsageError
from ..layout import LAUNCHER, SECRET_FLAGS, env_file, pkg_key, unit_path
from ..inventory.multinode import serves_http
from ..sglang import stack
from ..sglang.rules import expectations
from ..sglang.spec import intended, launch_args, metrics_on, said_as
from ..inventory import reach
from . import hardening
from .base import ServiceKind, kind_name


# The last line SGLang logs on start (srt/entrypoints/http_server.py): spec-tune times starts with it.
READY_LINE = r"fired up and ready to roll"
# What SGLang 0.5.23 logs while it starts, each line from its source (docs/ARCHITECTURE.md,
# "SGLang's start-up lines"); the first match of a line wins, the last matching line is the phase.
# The bars are tqdm's: weight_utils.py's with utils/common.py's BAR_FORMAT ("{desc}: {percentage:3.0f}%
# Completed | {n_fmt}/{total_fmt} [...]"), the Fastsafetensor loader's and the CUDA graph runner's
# with tqdm's own "{l_bar}{bar}| {n_fmt}/{total_fmt} [...]".
PROGRESS = [
    # Every loader's bar (weight_utils.py: safetensors, np_cache, pt, multi-thread, Fastsafetensor,
    # InstantTensor, Runai Model Streamer), in BAR_FORMAT or tqdm's own.
    [r"(?:Loading|Multi-thread loading) [^:]*:\s*\d+%[^|]*\|(?:[^|]*\|)? (\d+)/(\d+)", "loading weights {}/{}"],
    [r"Load weight begin", "loading weights"],
    [r"Load weight end", "weights loaded"],
    [r"Memory pool end", "KV cache allocated"],
    [
        r"Capturing batches \(bs=(\d+)[^)]*\):\s*\d+%\|[^|]*\| (\d+)/(\d+)",
        "capturing CUDA graphs: batch size {} ({}/{})",
    ],
    [
        r"Capturing prefill shape \(num_tokens=(\d+)[^)]*\):\s*\d+%\|[^|]*\| (\d+)/(\d+)",
        "capturing prefill CUDA graphs: {} tokens ({}/{})",
    ],
    [r"Capture cuda graph begin", "capturing CUDA graphs"],  # SGLang before 0.5
    [r"Capture cuda graph end", "CUDA graphs captured"],
    [r"Capture (.+?) (?:(?:CUDA|cuda) graph )?begin\.", "capturing {} CUDA graphs"],
    [r"Capture (.+?) (?:(?:CUDA|cuda) graph )?end\.", "{} CUDA graphs captured"],
    [READY_LINE, "ready to roll"],
]


DIFF_SUFFIX = ".patch"  # a patch that is a unified diff against SGLang's file, not the whole file


def patched_file(rel: str) -> str:
    """The file inside the sglang package a patch (whole file or diff) makes."""
    return rel[:-len(DIFF_SUFFIX)] if rel.endswith(DIFF_SUFFIX) else rel


def patch_key(venv: str, rel: str) -> str:
    """A patched file, by its path inside the sglang package."""
    return pkg_key(venv, f"sglang/{patched_file(rel)}")


def draft_config_path(svc: dict) -> str:
    return f"{svc['speculative']['draft_model_path'].rstrip('/')}/config.json"


class SGLang(ServiceKind):
    name = "sglang"
    titles = ("sglang::",)
    endpoints = protocol.Endpoints(ready="/health", info="/server_info", info_fallback="/get_server_info",
                                   models="/v1/models", generate="/generate", metrics="/metrics",
                                   configure_logging="/configure_logging",
                                   public=["/health", "/health_generate", "/ready", "/metrics"])

    def properties(self, svc):
        return {**super().properties(svc), "ExecStartPre": hardening.GPU_NODES_FIRST}

    module = "sglang.launch_server"
    # tokenizer_manager.sigterm_watchdog reads it (get_bool_env_var, os.getenv) each time it looks,
    # after SIGTERM: set, it exits without waiting for the requests in flight.
    quick_stop_env = "SGL_FORCE_SHUTDOWN=1"

    def description(self, svc):
        return f"SGLang {svc['name']} ({svc['model_path']})"

    def args(self, svc):
        return launch_args(svc)

    def secret_flags(self, svc):
        return [SECRET_FLAGS[key] for key in SECRET_FLAGS if svc.get(key)]

    def intended(self, svc):
        return intended(svc)

    def check(self, host, svc):
        want, accepted = expectations(svc, f"{host.name}: service {svc['name']}")
        v = svc.get("verify") or {}
        return protocol.ServiceCheck(
            name=svc["name"], port=self.port(svc), host=self.local_address(svc),
            served_model_name=svc.get("served_model_name"), intended=want, accepted=accepted, said_as=said_as(),
            timeout=v.get("timeout", 3600), stall_timeout=v.get("stall_timeout", 300), progress=PROGRESS,
            prompt=v.get("prompt", "The capital of France is"),
            min_accept_length=v.get("min_accept_length"), baseline_tok_s=v.get("baseline_tok_s"),
            managed=self.managed(svc, stack.venv_of(host)), weights=self.weights(svc),
            endpoints=self.endpoints if metrics_on(svc) else protocol.replace(self.endpoints, metrics=None),
            http=serves_http(svc),
            generate_body={"text": None, "sampling_params": {"temperature": 0}})

    def managed(self, svc, venv):
        out = [unit_path(svc["name"]), env_file(svc["name"]), LAUNCHER]
        out += [patch_key(venv, rel) for rel in svc.get("patches") or []]
        if svc.get("draft_config"):
            out.append(draft_config_path(svc))
        return out

    def weights(self, svc):
        return [path.rstrip("/") for _, path, source in weight_sources(svc) if source]

    def secrets(self, svc):
        return super().secrets(svc) + [svc[key] for key in SECRET_FLAGS if svc.get(key)]


# SGLang 0.5.23 (srt/utils/auth.py): with neither key set, its ~40 ADMIN_OPTIONAL endpoints
# (/configure_logging, /update_weights_from_disk, /load_lora_adapter, /start_profile, ...) answer
# anyone; and /server_info, a NORMAL endpoint, returns every resolved argument, both keys among them
# (utils/common.py build_server_info): an admin key without an api_key is read there by anyone.
ADMIN_EXAMPLES = "/configure_logging, /update_weights_from_disk, /load_lora_adapter"


# What extra_args may not say: where the server listens (the checks above read `bind` and `port`)
# and its keys (a flag's value is on the command line, where every user of the host reads it).
OWN_FLAGS = ("--host", "--port", "--api-key", "--admin-api-key")


def admin_surface(host, svc) -> str:
    """Refuses a server reachable beyond loopback whose admin endpoints anyone may call; its
    warning ("" when none) when the inventory says it is open on purpose (`open_admin: true`)."""
    bind = reach.bind(svc)
    where = f"{host.name}: service {svc['name']!r}"
    said = [a for a in map(str, svc.get("extra_args") or []) if a.split("=", 1)[0] in OWN_FLAGS]
    if said:
        raise UsageError(f"{where}: extra_args may not hold {said[0].split('=', 1)[0]}: give bind, port, api_key "
                         f"or admin_api_key (a key in extra_args would be on the command line)")
    if reach.loopback(bind) or svc.get("api_key"):
        return ""
    if svc.get("open_admin") is True:
        return (f"{where} listens on {bind} with no api_key (open_admin: true): anyone who reaches its port may "
                f"call SGLang's admin endpoints ({ADMIN_EXAMPLES}, ...)")
    alone = " (an admin_api_key alone is no lock: /server_info, open without an api_key, returns it)" \
        if svc.get("admin_api_key") else ""
    raise UsageError(f"{where}: listening on {bind}, it needs an api_key{alone}: without one, whoever reaches the "
                     f"port may call SGLang's admin endpoints ({ADMIN_EXAMPLES}, ...); "
                     f"set open_admin: true to serve it open on purpose")


def weight_sources(svc) -> list[tuple[str, str, dict | None]]:
    """(setting, path, source) of its target and, with speculation, its draft; source None: the
    weights are there already (no `weights:` / `draft_weights:`)."""
    out = [("model_path", svc["model_path"], svc.get("weights"))]
    draft = (svc.get("speculative") or {}).get("draft_model_path")
    if draft:
        out.append(("speculative.draft_model_path", draft, svc.get("draft_weights")))
    return out


def weight_peers(host) -> set[str]:
    """The inventory hosts this host copies weights from (rsync runs on both ends)."""
    sglang = [s for s in host.get("services") or [] if kind_name(s) == "sglang"]
    return {source["host"] for svc in sglang for _, _, source in weight_sources(svc)
            if source and source.get("source") == "peer" and source.get("host")}
