"""SGLang's router (`python -m sglang_router.launch_router`, the sglang-router wheel: a Rust
binary that runs on CPU), the second kind of service.

Its workers are the SGLang services of an inventory group (`workers: {group: G}`), reached at
`http://<router_address or address>:<port>` of their hosts (specops/inventory/reach.py).
Interface facts, from sglang-router 0.3.2 as it runs (docs/ARCHITECTURE.md, "The router"):
`GET /health` is 200 with or without workers; `GET /workers` lists `{"workers": [{"id", "url",
"is_healthy", "load", ...}], "total"}`; `POST /workers {"url"}` answers 202 and registers the
worker after its own health check; `DELETE /workers/<id>` answers 202 and removes it soon after;
`/generate` and `/v1/models` are forwarded to a worker (503 with none).  Its Prometheus metrics
(`smg_*`) are served on a port of their own, at any path (its own port's /metrics is 404).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import protocol
from ..errors import UsageError
from ..inventory import reach
from ..layout import SECRET_FLAGS, env_file, unit_path
from .base import ServiceKind, kind_name

ROUTER_VENV = "/opt/sglang-router/venv"
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
# sglang-router 0.3.2's metrics listener (router_args.py): --prometheus-port, default 29000, on
# --prometheus-host, default 0.0.0.0 (whatever the router's own --host).
METRICS_FLAG = "--prometheus-port"
METRICS_PORT = 29000


@dataclass(frozen=True)
class Worker:
    """One SGLang service behind a router: its host, its service, and the URL the router uses."""
    host: str
    service: str
    url: str


def workers_of(host, svc: dict) -> list[Worker]:
    """The router's workers: each SGLang service of its `workers.group` (or only `workers.service`)."""
    spec = svc.get("workers") or {}
    inv, group = host.inventory, spec.get("group")
    where = f"{host.name}: router {svc['name']!r}"
    bind = reach.bind(svc, Router.default_bind)
    if svc.get("admin_api_key") or svc.get("open_admin") is not None:
        raise UsageError(f"{where}: admin_api_key and open_admin are an SGLang server's; sglang-router takes "
                         f"only an api_key")
    if not svc.get("api_key") and not reach.loopback(bind):
        raise UsageError(f"{where}: listening on {bind}, it needs an api_key (whoever reaches it could add or "
                         f"remove workers and read what is sent to them)")
    if inv is None or group not in inv.groups:
        raise UsageError(f"{where}: workers.group {group!r} is not a group of the inventory")
    out = []
    for name in inv.groups[group]:
        other = inv.hosts[name]
        for s in other.get("services") or []:
            if kind_name(s) != "sglang" or (spec.get("service") and s["name"] != spec["service"]) \
                    or s.get("node_rank"):  # a service across nodes is served by its rank 0 only
                continue
            bind = reach.bind(s)
            if name != host.name and reach.loopback(bind):
                raise UsageError(f"{where}: worker {name}/{s['name']} listens on {bind} only; give it "
                                 f"`bind: 0.0.0.0` (or its address) so the router can reach it")
            if s.get("api_key") and s["api_key"] != svc.get("api_key"):
                raise UsageError(f"{where}: worker {name}/{s['name']} has an api_key the router does not send "
                                 f"(the router passes its own api_key to its workers: give them the same)")
            out.append(Worker(name, s["name"], reach.service_url(other, s, from_host=host.name, via="router_address")))
    if not out:
        raise UsageError(f"{where}: group {group!r} has no SGLang service to route to")
    return out


def metrics_port(svc: dict) -> int:
    """The port the router serves its Prometheus metrics on: --prometheus-port in its extra_args,
    else sglang-router's default."""
    args = [str(a) for a in svc.get("extra_args") or []]
    given = [args[i + 1] for i, a in enumerate(args[:-1]) if a == METRICS_FLAG]
    given += [a.split("=", 1)[1] for a in args if a.startswith(METRICS_FLAG + "=")]
    if not given:
        return METRICS_PORT
    if not given[-1].isdigit():
        raise UsageError(f"router {svc['name']!r}: {METRICS_FLAG} {given[-1]!r} is not a port")
    return int(given[-1])


def routers_of(inventory, worker_host: str) -> list[tuple[object, dict, list[Worker]]]:
    """Every router of the inventory that has a service of `worker_host` among its workers:
    (router host, router service, that host's workers in it)."""
    out = []
    for h in inventory.hosts.values():
        for s in h.get("services") or []:
            if kind_name(s) == "router":
                mine = [w for w in workers_of(h, s) if w.host == worker_host]
                if mine:
                    out.append((h, s, mine))
    return out


class Router(ServiceKind):
    name = "router"
    default_bind = "0.0.0.0"  # what its workers' clients reach: an api_key is required (workers_of)
    titles = ()
    module = "sglang_router.launch_router"
    # chat stays the default: sglang-router 0.3.2 routes /v1/chat/completions to a worker as it
    # does /generate, so spec-bench's prompts given as messages go through a router too
    endpoints = protocol.Endpoints(ready="/health", info="/workers", info_fallback=None, models=None,
                                   generate="/generate", public=["/health"], members="/workers")

    def description(self, svc):
        return f"SGLang router {svc['name']}"

    def venv(self, svc: dict) -> str:
        return svc.get("venv", ROUTER_VENV)

    def listens(self, svc):
        return super().listens(svc) + [(metrics_port(svc), "'s metrics")]

    def unit(self, svc):
        return protocol.UnitRef(name=svc["name"], grace=svc.get("stop_grace", 10), titles=[], gpus=[], settle=0)

    def args(self, svc):
        """`worker_urls` is filled in by the router role from the inventory (workers_of)."""
        out = ["--host", self.bind(svc), "--port", str(self.port(svc)),
               "--policy", svc.get("policy", "cache_aware")]
        if svc.get("retries") is False:
            out.append("--disable-retries")
        out += [str(a) for a in svc.get("extra_args") or []]
        urls = svc.get("worker_urls") or []
        return out + (["--worker-urls", *urls] if urls else [])

    def argv(self, svc, venv):
        return super().argv(svc, self.venv(svc))

    def secret_flags(self, svc):
        return [SECRET_FLAGS["api_key"]] if svc.get("api_key") else []  # sglang-router has no admin key

    def intended(self, svc):
        return {}  # its info endpoint lists workers, not arguments: verify checks `members`

    def check(self, host, svc):
        urls = [w.url for w in workers_of(host, svc)]
        v = svc.get("verify") or {}
        return protocol.ServiceCheck(
            name=svc["name"], port=self.port(svc), host=self.local_address(svc), timeout=v.get("timeout", 120),
            stall_timeout=v.get("stall_timeout", 120), endpoints=self.endpoints, members=urls,
            managed=self.managed(svc, self.venv(svc)),
            generate_body={"text": None, "sampling_params": {"temperature": 0}})

    def managed(self, svc, venv):
        return [unit_path(svc["name"]), env_file(svc["name"])]

    def secrets(self, svc):
        return super().secrets(svc) + ([svc["api_key"]] if svc.get("api_key") else [])

