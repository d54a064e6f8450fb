"""A service that spans hosts: `nodes: [rank-0 host, rank-1 host, ...]` with `tp` across them.

Each node runs the same service (refused otherwise: so a change to it reaches, and restarts,
every node's unit in the same deploy) plus the three flags SGLang derives a multi-node launch from:
`--nnodes`, `--node-rank` (the host's place in `nodes`) and `--dist-init-addr` (rank 0's
`node_address`, else its `address`, and `dist_init_port`: reach.py).  Rank 0 serves the API; the other ranks serve
only a health check
(SGLang 0.5.23's launch_dummy_health_check_server), so verify asks rank 0 and checks that the
others' units run and answer /health on their port.  Placed once when the inventory is loaded, so every role, the
spec rules and
the host's preflight see the whole argument list.
"""

from __future__ import annotations

from ..errors import UsageError
from . import reach

DIST_INIT_PORT = 50000


def place(inventory, host, svc: dict, file: str) -> dict:
    """The service as this host runs it: with nnodes, node_rank and dist_init_addr when it spans nodes."""
    nodes = svc.get("nodes")
    if not nodes:
        return svc
    where = f"{file}: {host.name}: service {svc.get('name')!r}"
    if len(set(nodes)) != len(nodes) or len(nodes) < 2:
        raise UsageError(f"{where}: nodes must name two or more different hosts")
    unknown = [n for n in nodes if n not in inventory.hosts]
    if unknown:
        raise UsageError(f"{where}: nodes: {unknown[0]!r} is not a host of the inventory")
    if host.name not in nodes:
        raise UsageError(f"{where}: this host is not one of its nodes ({', '.join(nodes)})")
    for n in nodes:  # every node runs its rank of the very same service: a change reaches every unit
        theirs = [_own(x) for x in inventory.hosts[n].get("services") or [] if x.get("name") == svc.get("name")]
        if theirs != [_own(svc)]:
            raise UsageError(f"{where}: node {n!r} must define service {svc.get('name')!r} exactly as the others "
                             f"do (the same arguments on every node; only the rank differs)")
    rank0 = reach.address(inventory.hosts[nodes[0]], via="node_address")
    return {**svc, "nnodes": len(nodes), "node_rank": nodes.index(host.name),
            "dist_init_addr": reach.hostport(rank0, svc.get("dist_init_port", DIST_INIT_PORT))}


def _own(svc: dict) -> dict:
    """A node's service as the inventory gives it (without what place() derived)."""
    return {k: v for k, v in svc.items() if k not in DERIVED}


DERIVED = ("nnodes", "node_rank", "dist_init_addr")


def spans(svc: dict) -> list[str]:
    """The hosts a service runs on together (empty: one host)."""
    return list(svc.get("nodes") or [])


def serves_http(svc: dict) -> bool:
    return not svc.get("node_rank")
