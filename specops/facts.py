"""The facts every task shows about a host, beyond what its ops ask for."""
from __future__ import annotations

from .run import HostRun
from .spec import DEFAULT_VENV

LOCK_DIR = "/run/specops.lock"


def base_wants(host) -> dict:
    """The venv, every service's unit, the GPUs and the lock: what status and facts show."""
    return {"venvs": [host.get("venv", DEFAULT_VENV)],
            "units": [s["name"] for s in host.get("services") or []],
            "gpu": True, "lock": LOCK_DIR}


def facts_probe(run: HostRun) -> dict:
    ops = [op for _, role_ops in run.plan for op in role_ops]
    return run.probe(ops, base_wants(run.host)).data
