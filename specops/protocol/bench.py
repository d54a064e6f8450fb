"""spec-bench on the host: the load levels and their figures, and the baseline server
without speculation run in a GPU window."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, List, Optional  # noqa: F401

from .parts import ServiceCheck, UnitRef  # noqa: F401
from .wire import DICT, LIST, Factory, message, request


@message
class BenchLevel:
    """One concurrency level of a spec-bench: its figures (output_tok_s, requests_s, ttft_p50/p99,
    itl_p50/p99 in seconds, requests, failed, seconds, and accept_length/accept_rate when the
    server runs speculation) and the raw per-request timings they come from."""
    concurrency: int
    figures: Dict[str, Any]
    raw: List[Dict[str, Any]] = LIST


@message
class SpecBenchResult:
    """The levels, in the order asked."""
    levels: List[BenchLevel]


@request("spec_bench")
class SpecBench:
    """Drive `service` on the host with the load client (agent/bench/specbench.py): per level of
    `concurrency`, `warmup` requests, then `requests` streaming requests of `max_new_tokens`
    from closed-loop clients, the prompts cycled in an order fixed by `seed`.  A prompt is a
    string (sent to the service's generate endpoint), {"messages": [{"role", "content"}, ...]}
    (sent to its chat endpoint), or, from a traffic sample, {"text" | "input_ids",
    "max_new_tokens"} (sent to its generate endpoint, with its own max_new_tokens when it has
    one).  With `sample`, the prompts are the sample's, picked as `sampled` picks."""
    service: ServiceCheck
    prompts: List[Any]  # each a str or {"messages": [{"role": str, "content": str}, ...]}
    concurrency: List[int] = Factory(lambda: [1, 8, 32])
    requests: int = 64
    warmup: int = 4
    max_new_tokens: int = 128
    seed: int = 0
    unit: Optional[str] = None  # the unit that must be listening on the port (default: the service's)
    sample: Optional[str] = None  # a traffic sample on the host (TrafficSample.path) in place of `prompts`
    sample_sha256: Optional[str] = None  # ... that must still be what was captured
    Result = SpecBenchResult


@message
class BaselineResult:
    """The transient unit that serves the baseline (stop it with a Stop of its UnitRef)."""
    unit: str


@request("baseline_start", changes_host=True)
class BaselineStart:
    """Inside a GPU window: run `argv` (the service's command minus its speculative flags) as the
    transient unit specops-baseline-<service>, with the service's env file and `env`,
    and wait until `ready` answers 200 on `host`:`port` (at most `timeout` s).  `properties`:
    the managed unit's settings the server needs too (its limits and sandboxing, its user)."""
    service: str
    argv: List[str]
    port: int
    host: str = "127.0.0.1"
    ready: str = "/health"
    env: Dict[str, str] = DICT
    gpus: Optional[List[int]] = None
    timeout: float = 3600
    properties: Dict[str, str] = DICT
    label: str = "baseline"  # how its progress lines name it ("candidate" for spec-tune's)
    what: str = "the target without speculation"  # what runs, named before the unit ("steps 3, topk 1, …")
    Result = BaselineResult


@message
class StartupResult:
    """Seconds from the unit's main process start to its ready line (None: not in its journal)."""
    seconds: Optional[float] = None


@request("startup")
class Startup:
    """How long the current run of `unit` took to start: from systemd's start of its main process
    to the first line of that run (its own journal lines only) matching `ready_line`."""
    unit: str
    ready_line: str
    Result = StartupResult


def sampled(prompts: list, limit: Optional[int], seed: int) -> list:
    """`limit` of `prompts`, picked by `seed` and kept in their order; all when there are no more
    than that.  One rule for a prompt file (on the controller) and a traffic sample (on the host)."""
    import random
    if limit is None or limit >= len(prompts):
        return list(prompts)
    return [prompts[i] for i in sorted(random.Random(seed).sample(range(len(prompts)), limit))]
