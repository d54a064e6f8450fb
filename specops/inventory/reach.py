"""How one host reaches another's service: the one place that says it.

A host is reached by others at its `address` (else its inventory name, as the controller reaches
it), unless it names an address for one kind of peer: `router_address` (routers, for its
workers), `node_address` (the other nodes of a service across hosts, for rank 0).  A process on
the service's own host reaches it over loopback when it listens there or on every address.  A
service's port is its `port`, else layout.DEFAULT_PORT.  What is written from here: a router's
worker URLs (specops/services/router.py), a multi-node service's --dist-init-addr
(multinode.py), and Prometheus's scrape targets (specops/fleetwide/targets.py).
"""
from __future__ import annotations

import ipaddress

from ..layout import DEFAULT_PORT

LOOPBACK = "127.0.0.1"
EVERY_ADDRESS = ("0.0.0.0", "::")


def port(svc: dict) -> int:
    """The port a service listens on."""
    return svc.get("port", DEFAULT_PORT)


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
    """Where a process on the host reaches a server bound to `bind`."""
    return LOOPBACK if loopback(bind) or bind in EVERY_ADDRESS else bind


def hostport(addr: str, number: int) -> str:
    """`addr:number`, an IPv6 address in brackets (as URLs and SGLang's --dist-init-addr want it)."""
    return f"[{addr}]:{number}" if ":" in addr else f"{addr}:{number}"


def service_hostport(to_host, svc: dict, *, from_host: str | None = None, via: str | None = None,
                     bind: str = LOOPBACK, number: int | None = None) -> str:
    """host:port at which `from_host` (a host name; None: a machine outside the inventory, such as
    Prometheus) reaches `to_host`'s service `svc`: over loopback from its own host (`bind`: the
    kind's default bind address), else at to_host's address for `via`.  `number`: another port of
    the service than its own (a metrics port)."""
    addr = local_address(svc.get("bind", bind)) if from_host == to_host.name else address(to_host, via)
    return hostport(addr, port(svc) if number is None else number)


def service_url(to_host, svc: dict, **how) -> str:
    """The http:// URL of service_hostport(to_host, svc, **how)."""
    return f"http://{service_hostport(to_host, svc, **how)}"
