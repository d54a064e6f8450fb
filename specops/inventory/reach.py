"""How one host reaches another's service: the one place that says it.

A host is reached by others at its `address` (else its inventory name, as the controller reaches
it), unless it names an address for one kind of peer: `router_address` (routers, for its
workers), `node_address` (the other nodes of a service across hosts, for rank 0).  A process on
the service's own host reaches it where it listens (local_address).  A service's port is its
`port`, else layout.DEFAULT_PORT; its bind address its `bind`, else its kind's default
(127.0.0.1; a router's 0.0.0.0).  What is written from here: a router's worker URLs
(specops/kinds/router.py), a multi-node service's --dist-init-addr (multinode.py), verify's and
spec-bench's address (kinds/base.py), and Prometheus's scrape targets (fleetwide/targets.py).
"""
from __future__ import annotations

import ipaddress

from ..agent.services.http import authority
from ..layout import DEFAULT_PORT

LOOPBACK = "127.0.0.1"
EVERY_ADDRESS = ("0.0.0.0", "::")


def port(svc: dict) -> int:
    """The port a service listens on."""
    return svc.get("port", DEFAULT_PORT)


def bind(svc: dict, default: str = LOOPBACK) -> str:
    """The address a service listens on: its `bind`, else its kind's `default`."""
    return svc.get("bind", default)


def address(host, via: str | None = None) -> str:
    """Where others reach `host`: its `via` var (how that kind of peer reaches it) when set, else
    its `address`, else its inventory name."""
    return (host.get(via) if via else None) or host.get("address") or host.name


def loopback(bind: str) -> bool:
    """A bind address only the host itself can reach: a loopback address, or `localhost` (a name
    that merely starts with 127. is not one)."""
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def local_address(bind: str) -> str:
    """Where a process on the host reaches a server bound to `bind`: where it listens (::1 is not
    127.0.0.1, nor is 127.0.0.2); on every IPv4 address, or `localhost` (SGLang's uvicorn takes
    every address the name resolves to), at 127.0.0.1; on every IPv6 address at ::1 (asyncio's
    IPv6 socket is IPv6-only: 127.0.0.1 would be anyone's to take)."""
    if bind == "::":
        return "::1"
    return LOOPBACK if bind in ("0.0.0.0", "localhost") else bind


def hostport(addr: str, number: int) -> str:
    """`addr:number`, an IPv6 address in brackets (as URLs and SGLang's --dist-init-addr want it)."""
    return authority(addr, number)


def service_hostport(to_host, svc: dict, *, from_host: str | None = None, via: str | None = None,
                     default_bind: str = LOOPBACK, number: int | None = None) -> str:
    """host:port at which `from_host` (a host name; None: a machine outside the inventory, such as
    Prometheus) reaches `to_host`'s service `svc`: where it listens from its own host
    (`default_bind`: its kind's), else at to_host's address for `via`.  `number`: another port of
    the service than its own (a metrics port)."""
    addr = local_address(bind(svc, default_bind)) if from_host == to_host.name else address(to_host, via)
    return hostport(addr, port(svc) if number is None else number)


def service_url(to_host, svc: dict, **how) -> str:
    """The http:// URL of service_hostport(to_host, svc, **how)."""
    return f"http://{service_hostport(to_host, svc, **how)}"
