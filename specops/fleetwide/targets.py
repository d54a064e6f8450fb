"""Prometheus's scrape targets, from the inventory, as file_sd entries (`{"targets": ["h:p"],
"labels": {...}}`), one list per job:

- `sglang`: every SGLang service that serves HTTP (rank 0 of a service across nodes: the other
  ranks serve only a health check) with its metrics on (`metrics: false` leaves it out), at its
  port; labels host, group, service, role, served (its served_model_name, else its
  model_path: SGLang's own default, srt/arg_groups/serving_hook.py);
- `sglang-router`: every router, at the port of its own metrics listener (kinds/router.py);
- `node`: the node_exporter of every host whose `monitoring` var is on (true, or the role's
  settings as a mapping), whose textfile carries specops's series.

Every address is reach.py's, as a machine outside the inventory reaches the host.  No target
label is one SGLang's own series carry (SGLANG_LABELS): Prometheus would rename the series' own
`exported_<name>`.
"""
from __future__ import annotations

from ..inventory import reach
from ..inventory.multinode import serves_http
from ..inventory.node_exporter import monitored
from ..kinds import of_kind
from ..kinds.router import metrics_port
from ..layout import NODE_EXPORTER_PORT
from ..sglang.spec import metrics_on

JOBS = ("sglang", "sglang-router", "node")
ROLES = {"sglang": "sglang", "sglang-router": "router", "node": "node"}
# the labels SGLang 0.5.23 puts on its own series (srt/observability/metrics_collector.py): a target
# label of the same name would take the series' own, which Prometheus then renames exported_<name>
SGLANG_LABELS = frozenset({"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"})


def group_of(host) -> str:
    """The host's first group by name, leaving out the implicit `all` and `ungrouped`."""
    return next((g for g in host.groups if g not in ("all", "ungrouped")), "all")


def served(svc: dict) -> str:
    """The model the service serves, as SGLang names it (its own series' model_name)."""
    return svc.get("served_model_name") or svc["model_path"]


def _entry(target: str, host, job: str, **labels) -> dict:
    return {"targets": [target], "labels": {"host": host.name, "group": group_of(host), "role": ROLES[job], **labels}}


def scraped(host) -> list[dict]:
    """The host's SGLang services Prometheus scrapes: those serving HTTP with their metrics on."""
    return [svc for svc in of_kind(host, "sglang") if serves_http(svc) and metrics_on(svc)]


def targets(inventory) -> tuple[dict[str, list[dict]], list[str]]:
    """(job → its file_sd entries, sorted; warnings about targets Prometheus may not reach)."""
    out: dict[str, list[dict]] = {job: [] for job in JOBS}
    warnings = []
    for host in inventory.hosts.values():
        for svc in scraped(host):
            bind = reach.bind(svc)
            if reach.loopback(bind):
                warnings.append(f"{host.name}/{svc['name']} listens on {bind} only: a Prometheus on another "
                                f"machine cannot scrape it (give it `bind: 0.0.0.0`, or its address)")
            out["sglang"].append(_entry(reach.service_hostport(host, svc), host, "sglang", service=svc["name"],
                                        served=served(svc)))
        for svc in of_kind(host, "router"):
            out["sglang-router"].append(_entry(reach.service_hostport(host, svc, number=metrics_port(svc)), host,
                                               "sglang-router", service=svc["name"]))
        if monitored(host):
            out["node"].append(_entry(reach.hostport(reach.address(host), NODE_EXPORTER_PORT), host, "node"))
    for entries in out.values():
        entries.sort(key=lambda e: (e["labels"]["host"], e["labels"].get("service", ""), e["targets"]))
    return out, warnings
