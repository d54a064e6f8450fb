"""What a host tells Prometheus about itself: node_exporter's textfile, written by the agent
after a deploy, a rollback or a verify (the run's last request), and by the monitoring role's
timer every minute (specops/agent/textfile.py)."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, Optional, Tuple  # noqa: F401

from .wire import message, request


@message
class TextfileResult:
    """Where the textfile went (None: its directory does not exist, so nothing was written), its
    size, how many series it holds, and the host CPU-seconds its writing took."""
    path: Optional[str]
    series: int = 0
    bytes: int = 0
    cpu_s: float = 0.0


@request("textfile")
class Textfile:
    """Write `directory`/specops.prom from the current release and the host as it is now: never
    a secret, written whole under a temporary name and renamed.  Nothing when the directory is
    missing (the host's node exporter is not installed yet).  It changes nothing specops deploys
    (the timer writes the same file with no lock), so it needs no host lock."""
    directory: str
    Result = TextfileResult


def release_figure(bench, tune, spec):
    # type: (Optional[dict], Optional[dict], dict) -> Optional[Tuple[float, Optional[float], str]]
    """(accept length, speedup, source) a release measured for the settings it runs, or None:
    its spec-bench (`bench`, a perf.json record) at its lowest concurrency, else the spec-tune
    (`tune`) candidate with the `spec` it runs (server_info fields).  The textfile and status
    both judge production against this figure."""
    bench, tune = bench or {}, tune or {}
    if isinstance(bench.get("accept_length"), dict) and bench["accept_length"]:
        at = min(bench["accept_length"], key=int)
        if bench["accept_length"][at]:
            return bench["accept_length"][at], (bench.get("speedup") or {}).get(at), "spec-bench"
    now = {k: spec.get("speculative_" + k) for k in ("num_steps", "eagle_topk", "num_draft_tokens")}
    for c in tune.get("candidates") or []:
        if isinstance(c, dict) and c.get("settings") == now and c.get("levels"):
            level = c["levels"][0] if isinstance(c["levels"][0], dict) else {}
            accept = (level.get("figures") or {}).get("accept_length")
            if accept:
                return accept, (c.get("speedup") or {}).get(str(level.get("concurrency"))), "spec-tune"
    return None
