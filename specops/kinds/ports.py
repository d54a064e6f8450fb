"""Which ports a host's listeners take, and the plan-time refusal of two that take the same one:
every service's own port, a router's metrics listener, and node_exporter's on a host the
monitoring role runs it on.  A clash would otherwise show only as a server that never starts,
or as one address Prometheus scrapes under two jobs."""
from __future__ import annotations

from ..errors import UsageError
from ..inventory.node_exporter import monitored
from ..layout import NODE_EXPORTER_PORT
from . import of_host


def listeners(host) -> list[tuple[int, str]]:
    """(port, who listens there) for everything specops starts on the host."""
    out = [(port, f"{kind.name} {svc['name']!r}{what}") for kind, svc in of_host(host)
           for port, what in kind.listens(svc)]
    if monitored(host):
        out.append((NODE_EXPORTER_PORT, "node_exporter (monitoring)"))
    return out


def check_ports(host) -> None:
    """Refuses, before any connection, two listeners on one port, naming both."""
    seen: dict[int, str] = {}
    for port, who in listeners(host):
        if port in seen:
            raise UsageError(f"{host.name}: port {port} is taken twice: by {seen[port]} and by {who}")
        seen[port] = who
