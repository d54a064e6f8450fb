"""The requests a rolling deploy makes: a router's workers listed, taken out, put back; a
worker waited on until it has no request in flight."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, Optional  # noqa: F401

from .parts import ServiceCheck  # noqa: F401
from .wire import DICT, message, request


@message
class MembersResult:
    """What the router lists: url → {is_healthy, load, id}; `waited` seconds until it said so;
    `absent`: the router's unit is not running (nothing routes through it; it takes its workers
    from its command line when it starts)."""
    members: Dict[str, Any] = DICT
    waited: float = 0.0
    absent: bool = False
    not_serving: Optional[str] = None  # why a generation through it failed at the last try


@request("router_members")
class RouterMembers:
    """Ask the router on this host (`router`, its ServiceCheck) which workers it has; with
    `serving_within`, also generate through it until it answers 200, at most that many seconds
    (its /workers can list every worker healthy while it answers 503 to every request)."""
    router: ServiceCheck
    serving_within: Optional[float] = None
    Result = MembersResult


# Router membership is changed from a worker's run, which holds its own host's lock and not the
# router host's: two workers' runs may change one router at once.  So the membership requests do
# not ask for the lock (the router keeps its own list consistent), unlike the requests that change
# a host's files or units (`changes_host`).
@request("router_remove")
class RouterRemove:
    """Take `url` out of the router and wait (at most `timeout` s) until it no longer lists it."""
    router: ServiceCheck
    url: str
    timeout: float = 30
    Result = MembersResult


@request("router_add")
class RouterAdd:
    """Put `url` into the router and wait (at most `timeout` s) until it lists it healthy."""
    router: ServiceCheck
    url: str
    timeout: float = 60
    Result = MembersResult


@message
class IdleResult:
    """`idle`: no request running or waiting (seen twice, `settle` s apart); the last load read."""
    idle: bool
    waited: float
    running: int = 0
    waiting: int = 0


@request("worker_idle")
class WorkerIdle:
    """Wait until the service on this host (`service`) has no request in flight, as its
    `loads` endpoint says (SGLang: GET /v1/loads), at most `timeout` s."""
    service: ServiceCheck
    loads: str = "/v1/loads"
    timeout: float = 120
    settle: float = 0.5
    Result = IdleResult
