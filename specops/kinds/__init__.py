"""The seam between the engine and the kinds of service it runs (base.ServiceKind): the engine
(pipeline, verify, status, run) talks to services only through these; roles build their ops
from them.  SGLang's server is the first kind, the router the second.
"""
from __future__ import annotations

from .. import protocol
from ..errors import UsageError
from ..sglang import stack
from .base import QUICK_STOP_SIGNAL, ServiceKind, kind_name
from .router import Router
from .sglang import SGLang

KINDS: dict[str, ServiceKind] = {k.name: k for k in (SGLang(), Router())}


def kind_of(svc: dict) -> ServiceKind:
    name = kind_name(svc)
    if name not in KINDS:
        raise UsageError(f"service {svc.get('name')!r}: unknown kind {name!r} (known: {', '.join(sorted(KINDS))})")
    return KINDS[name]


def of_host(host) -> list[tuple[ServiceKind, dict]]:
    return [(kind_of(s), s) for s in host.get("services") or []]


def of_kind(host, name: str) -> list[dict]:
    """The host's services of one kind: what a role for that kind works on."""
    return [s for k, s in of_host(host) if k.name == name]


def venv_of(host) -> str:
    """The venv the host's SGLang services run: its stack's (specops/sglang/stack.py)."""
    return stack.venv_of(host)


def unit_refs(host, quick=()) -> dict[str, protocol.UnitRef]:
    """`quick`: names of services whose stop need not drain (out of their routers and idle, or a
    stop the user asked to be quick), for the kinds that can skip it."""
    return {s["name"]: protocol.replace(k.unit(s), quick=QUICK_STOP_SIGNAL)
            if s["name"] in quick and k.quick_stop_env else k.unit(s) for k, s in of_host(host)}


def managed_files(host) -> list[str]:
    return sorted({key for k, s in of_host(host) for key in k.managed(s, venv_of(host))})


def checks(host) -> list[protocol.ServiceCheck]:
    return [k.check(host, s) for k, s in of_host(host)]


def secrets(hosts) -> set[str]:
    return {v for h in hosts for k, s in of_host(h) for v in k.secrets(s)}
