"""The facts every task shows about a host, beyond what its ops ask for."""
from __future__ import annotations

from .. import kinds, protocol
from ..run import HostRun


def base_wants(host) -> protocol.Probe:
    """The venv, every service's unit, the GPUs with who holds their memory, and the lock: what status
    and facts show."""
    return protocol.Probe(venvs=[kinds.venv_of(host)], units=[s["name"] for _, s in kinds.of_host(host)],
                          gpu=True, gpu_apps=True, lock_peek=True)


def facts_probe(run: HostRun) -> dict:
    ops = [op for _, role_ops in run.plan for op in role_ops]
    return run.probe(ops, base_wants(run.host)).data
