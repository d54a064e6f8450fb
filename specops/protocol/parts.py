"""The protocol's shared parts: who holds a lock, a unit, a service check and report, a process
(the actions an apply batch carries are actions.py's)."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, List, Optional  # noqa: F401

from .wire import DICT, LIST, Factory, message


# ---- shared parts ----

@message
class Holder:
    """Who holds a host's lock, shown to anyone refused by it.  `token` proves it is ours."""
    who: str
    pid: int
    task: str
    since: str
    token: str
    lease: float = 120.0  # seconds the lock stays held without a request of its run


@message
class UnitRef:
    """A systemd service specops runs, with what stop needs to account for its processes:
    `grace` seconds between SIGTERM and SIGKILL for leftovers, `settle` seconds to let the
    unit's processes release the GPUs, `titles` the process-title prefixes of its kind
    (used to describe processes, never to attribute them)."""
    name: str
    grace: float = 10
    settle: float = 3
    titles: List[str] = LIST
    gpus: Optional[List[int]] = None  # the GPU indices it uses (None: every GPU)
    ranks: int = 1  # the nodes it spans: a rank's run ends by itself when a peer stops first
    # A stop that need not drain: this signal goes to the main process first (its launcher then
    # sets the server's own force-shutdown variable), if that process catches it
    quick: Optional[str] = None


@message
class Endpoints:
    """How to ask a kind of service over HTTP: ready (200 when serving), its effective
    arguments (`info`, then `info_fallback` on 404), the models it serves, a generation, and
    an OpenAI chat completion (spec-bench's prompts given as messages)."""
    ready: str = "/health"
    info: str = "/server_info"
    info_fallback: Optional[str] = "/get_server_info"
    models: Optional[str] = "/v1/models"
    generate: Optional[str] = "/generate"
    chat: Optional[str] = "/v1/chat/completions"
    public: List[str] = Factory(lambda: ["/health"])  # paths that need no API key
    # A router's: lists its workers as {"workers": [{"url", "is_healthy", "load", ...}]}
    members: Optional[str] = None
    # Prometheus's text (SGLang started with --enable-metrics), read by status; needs no API key
    metrics: Optional[str] = None
    # SGLang's run-time logging settings, its request dump among them (an admin endpoint)
    configure_logging: Optional[str] = None


@message
class ServiceCheck:
    """How verify checks one service; stored in each release's manifest (no secrets: the agent
    reads the API key from the service's env file)."""
    name: str
    port: int
    host: str = "127.0.0.1"
    served_model_name: Optional[str] = None
    intended: Dict[str, Any] = DICT
    accepted: Dict[str, Any] = DICT
    said_as: Dict[str, str] = DICT  # field -> its inventory key, for the words (sglang/spec.py said_as)
    timeout: float = 3600           # the ceiling on a start, however much progress it shows
    stall_timeout: float = 300      # a start with no progress for this long has failed
    progress: List[List[str]] = LIST  # [regex, label]: what a journal line says the service is doing
    prompt: str = "The capital of France is"
    max_new_tokens: int = 32
    min_accept_length: Optional[float] = None
    baseline_tok_s: Optional[float] = None
    managed: List[str] = LIST
    weights: List[str] = LIST  # weights directories it runs: their content must not be newer than its start
    endpoints: Endpoints = Factory(Endpoints)
    generate_body: Dict[str, Any] = DICT  # {"text"/"sampling_params"}; prompt filled in
    members: List[str] = LIST  # URLs endpoints.members must list, healthy (a router's workers)
    http: bool = True  # False: a multi-node service's rank > 0 (no HTTP; verified through rank 0)


@message
class ServiceReport:
    """What verify (or peek) found for one service; `failures` empty means verified."""
    name: str
    failures: List[str] = LIST
    notes: List[str] = LIST
    checks: List[str] = LIST
    effective: Optional[Dict[str, Any]] = None
    generate: Optional[Dict[str, Any]] = None
    journal: Optional[str] = None
    ready_after: Optional[float] = None
    health_statuses: List[Any] = LIST
    stale: bool = False
    members: Optional[Dict[str, Any]] = None  # a router's: url → {is_healthy, load, id}
    not_serving: Optional[str] = None  # a router's: why a generation through it failed (peek)
    starting: bool = False  # still starting when a Verify with answer_within answered: nothing else checked
    rank_down: Optional[str] = None  # a rank > 0 whose unit is not running and not about to: its state
    # peek: the version the server reports, and its production figures (agent/services/production.py)
    running: Optional[Dict[str, Any]] = None


@message
class Process:
    """A process holding GPU memory, or one specops killed: pid, its (cleaned) title and user,
    MiB held (None when nvidia-smi cannot tell), and the unit it belongs to, if any."""
    pid: int
    title: str = ""
    user: str = ""
    mib: Optional[int] = None
    unit: Optional[str] = None
    signal: Optional[str] = None
