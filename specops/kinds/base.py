"""What a kind of service is to the engine (ServiceKind): its argv, the values it intends and how
to read them back, how to ask whether it is ready and what it generates, which processes and
files are its own, which inventory values are secret.  The kinds themselves are router.py and
sglang.py; the package gathers them."""
from __future__ import annotations

from typing import Any

from .. import protocol
from ..inventory import reach
from ..layout import LAUNCHER, venv_python
from . import hardening


# The launcher's signal for quick_stop_env, sent by the agent before a stop that need not drain
# (UnitRef.quick); SGLang 0.5.23 handles no SIGUSR2 of its own.
QUICK_STOP_SIGNAL = "SIGUSR2"


class ServiceKind:
    """One kind of service.  Subclasses set `name`, `titles`, `endpoints` and implement the rest."""
    name = ""
    titles: tuple[str, ...] = ()          # process-title prefixes its processes take
    endpoints = protocol.Endpoints()
    default_bind = reach.LOOPBACK         # where it listens without a `bind:`

    def port(self, svc: dict) -> int:
        return reach.port(svc)

    def bind(self, svc: dict) -> str:
        return reach.bind(svc, self.default_bind)

    def local_address(self, svc: dict) -> str:
        """Where verify, bench and status reach it from its own host (reach.py, as a router on that host)."""
        return reach.local_address(self.bind(svc))

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
        its limits, and the sandboxing of kinds/hardening.py."""
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
        return [venv_python(venv), LAUNCHER, *secret, *quick, self.module, *self.args(svc)]

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


def kind_name(svc: dict) -> str:
    """The name of a service's kind: `kind:`, else SGLang's server."""
    return svc.get("kind", "sglang")
