"""Which ports a host's listeners take, and the plan-time refusal of two that take the same one:
every service's own port, a router's metrics listener, and node_exporter's on a host the
monitoring role runs it on.  A clash would otherwise show only as a server that never starts,
or as one address Prometheus scrapes under two jobs."""
from __future__ import annotations

from ..errors import UsageError
from ..inventory.node_exporter import monitored
from ..layout import NODE_EXPORTER_PORT
from . import of_host


def listeners(host) -> list[tuple[int, str, str]]:
    """(port, who listens there, where the inventory set it: 'file: key.path', or '' for a host
    not loaded from one) for everything specops starts on the host."""
    origins = getattr(host, "origins", {})
    services = origins.get("services", "")
    out = [(port, f"{kind.name} {svc['name']!r}{what}", services and f"{services}[{i}]")
           for i, (kind, svc) in enumerate(of_host(host)) for port, what in kind.listens(svc)]
    if monitored(host):
        out.append((NODE_EXPORTER_PORT, "node_exporter", origins.get("monitoring", "")))
    return out


def check_ports(host) -> None:
    """Refuses, before any connection, two listeners on one port, naming both and where each is
    set: the two may come from different files (a service in host_vars, monitoring in group_vars)."""
    seen: dict[int, str] = {}
    for port, who, where in listeners(host):
        named = f"{who} ({where})" if where else who
        if port in seen:
            raise UsageError(f"{host.name}: port {port} is taken twice: by {seen[port]} and by {named}")
        seen[port] = named
