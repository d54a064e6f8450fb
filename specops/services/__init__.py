"""The seam between the engine and the kinds of service it runs.

A ServiceKind holds everything the engine needs to know about one kind of service:
its argv, the values it intends and how to read them back, how to ask it whether it
is ready and what it generates, which processes and files are its own, and which
inventory values are secret.  The engine (pipeline, verify, status, run) talks to
services only through this; roles build their ops from it.  SGLang's server is the
first kind.
"""
from __future__ import annotations

from typing import Any

from .. import protocol
from ..errors import UsageError
from ..inventory import reach
from ..layout import LAUNCHER
from ..sglang import stack
from . import hardening


# The launcher's signal for quick_stop_env, sent by the agent before a stop that need not drain
# (UnitRef.quick); SGLang 0.5.23 handles no SIGUSR2 of its own.
QUICK_STOP_SIGNAL = "SIGUSR2"


class ServiceKind:
    """One kind of service.  Subclasses set `name`, `titles`, `endpoints` and implement the rest."""
    name = ""
    titles: tuple[str, ...] = ()          # process-title prefixes its processes take
    endpoints = protocol.Endpoints()

    def port(self, svc: dict) -> int:
        return reach.port(svc)

    def listens(self, svc: dict) -> list[tuple[int, str]]:
        """(port, what listens there, after the service's name) for each of its listeners."""
        return [(self.port(svc), "")]

    def unit(self, svc: dict) -> protocol.UnitRef:
        """How stop and restart account for its processes: the GPUs it uses (CUDA_VISIBLE_DEVICES,
        else all of them), how long leftovers get between SIGTERM and SIGKILL."""
        visible = svc.get("cuda_visible_devices")
        gpus = [int(g) for g in str(visible).split(",") if g.strip().isdigit()] if visible else None
        return protocol.UnitRef(name=svc["name"], grace=svc.get("stop_grace", 10), titles=list(self.titles), gpus=gpus,
                                ranks=len(svc.get("nodes") or ()) or 1)

    def description(self, svc: dict) -> str:
        """Its unit's Description= line."""
        return f"{self.name} {svc['name']}"

    def properties(self, svc: dict) -> dict[str, str]:
        """Unit settings its server needs wherever it runs (the managed unit, spec-bench's baseline):
        its limits, and the sandboxing of services/hardening.py."""
        return {"TimeoutStopSec": str(svc.get("timeout_stop_sec", 120)),
                "LimitNOFILE": str(svc.get("limit_nofile", 65535)), **hardening.PROPERTIES,
                **hardening.as_user(svc)}

    module = ""                           # what `python -m` runs

    def args(self, svc: dict) -> list[str]:
        """Its arguments after the module (no secrets: see secret_flags)."""
        raise NotImplementedError

    def secret_flags(self, svc: dict) -> list[tuple[str, str]]:
        """(env-file variable, flag) pairs the launcher hands the module in-process."""
        return []

    # VAR=VALUE that makes its server exit at SIGTERM without draining, read by the server from its
    # own environment when it handles SIGTERM: the launcher sets it on QUICK_STOP_SIGNAL (None: none).
    quick_stop_env: str | None = None

    def argv(self, svc: dict, venv: str) -> list[str]:
        """The command line systemd starts: the launcher, never a secret."""
        secret = [w for env, flag in self.secret_flags(svc) for w in ("--secret", env, flag)]
        quick = ["--on-signal", QUICK_STOP_SIGNAL, self.quick_stop_env] if self.quick_stop_env else []
        return [f"{venv}/bin/python", LAUNCHER, *secret, *quick, self.module, *self.args(svc)]

    def intended(self, svc: dict) -> dict[str, Any]:
        """The values its info endpoint must report."""
        raise NotImplementedError

    def check(self, host, svc: dict) -> protocol.ServiceCheck:
        """What verify asks of it (no secrets)."""
        raise NotImplementedError

    def managed(self, svc: dict, venv: str) -> list[str]:
        """Every managed file the running service depends on: it must have started after them."""
        raise NotImplementedError

    def weights(self, svc: dict) -> list[str]:
        """The weights directories it runs, which specops brings in (a `weights:` source): a
        change of their content restarts it, and the release records what they were."""
        return []

    def secrets(self, svc: dict) -> list[str]:
        """Inventory values that must never be printed."""
        return [v for v in (svc.get("env_secret") or {}).values() if v]


KINDS: dict[str, ServiceKind] = {}


def register(kind: ServiceKind) -> ServiceKind:
    KINDS[kind.name] = kind
    return kind


def kind_of(svc: dict) -> ServiceKind:
    name = svc.get("kind", "sglang")
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


from . import router, sglang  # noqa: E402,F401  (registers the kinds)
