"""A sample of the traffic a service serves, taken through SGLang's own request dump: it stays on
the host (root's, 0700, below layout.TRAFFIC_DIR) for the task that uses it and is dropped when
the task ends; the controller gets its digest, size and time span (and the prompts only when it
asks to fetch them)."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, List, Optional  # noqa: F401

from .parts import ServiceCheck  # noqa: F401
from .wire import message, request


@message
class TrafficSample:
    """Where the sample is on the host (a JSON list of {"text" | "input_ids", "max_new_tokens"}),
    its sha256, how many prompts and bytes, the first request's arrival and the last's end
    (wall-clock seconds), the dump files read, why the capture ended ("count": the requests
    asked for were dumped; "time": the time limit came first), the requests left out (neither
    text nor token ids), those that came as token ids (a chat's templated prompt), those the
    server held from before, and, when fetched, the prompts themselves."""
    path: str
    sha256: str
    requests: int
    bytes: int
    first: Optional[float]
    last: Optional[float]
    files: int
    ended: str
    skipped: int = 0
    token_ids: int = 0
    stale: int = 0  # requests the server held from before the dump went on: left out
    prompts: Optional[List[Any]] = None


@request("traffic_capture", changes_host=True)
class TrafficCapture:
    """Turn the request dump of `service` (the running `unit`) on into a directory of specops's,
    wait until `count` finished requests are dumped or `timeout` seconds pass, turn it off, and
    make the sample of what was dumped.  A dump specops did not start is left alone (refused); on
    any failure the dump is off and nothing is left.  `fetch`: the prompts come back too."""
    service: ServiceCheck
    unit: str
    count: int
    timeout: float = 600
    fetch: bool = False
    Result = TrafficSample


@message
class TrafficDropped:
    """Whether a sample was there to remove, whether a dump of specops's was still on, and whether
    it was turned off (not when the port is no longer the unit's)."""
    removed: bool
    dump_was_on: bool
    turned_off: bool = False


@request("traffic_drop", changes_host=True)
class TrafficDrop:
    """The end of a sample's task: the dump into specops's directory off if it still is, and every
    sample of `service` removed."""
    service: ServiceCheck
    unit: str
    Result = TrafficDropped
