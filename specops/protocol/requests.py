"""The requests, one per round trip, each with the Result the agent answers it with."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, List, Optional  # noqa: F401

from .wire import DICT, LIST, Factory, message, request

from .parts import Action, Holder, Process, ServiceCheck, ServiceReport, UnitRef  # noqa: F401


# ---- requests ----

@message
class ProbeResult:
    """The facts.  files: key → {path, exists, type, sha256, size, mtime, mode, owner, group,
    content_b64 (when asked and different), pycache [{name, mtime}], unresolved};
    units: name → systemctl show properties (+ text, the unit file); venvs: path → {exists,
    python, version, tag, packages, dirs, torch_cuda, broken}; gpu: {present, gpus [{index,
    uuid, name, driver_version, memory.total, memory.used (None when unknown)}], apps
    [Process], driver, unknown [fields nvidia-smi could not report], error};
    lock: {acquired, token, holder, running [an earlier run's commands]} when taken, {held, holder}
    when peeked; weights: dest →
    {manifest (or None), differ [files whose size or mtime moved], free (bytes)}."""
    time: float
    hostname: str
    python: str
    files: Dict[str, Any] = DICT
    units: Dict[str, Any] = DICT
    venvs: Dict[str, Any] = DICT
    listings: Dict[str, Dict[str, int]] = DICT
    checks: Dict[str, int] = DICT
    weights: Dict[str, Any] = DICT
    gpu: Optional[Dict[str, Any]] = None
    lock: Optional[Dict[str, Any]] = None
    interrupted: Optional[Dict[str, Any]] = None  # a batch an earlier run was cut off in: {holder, done, not_done}


@request("probe")
class Probe:
    """Gather every fact a plan needs in one pass.  `content`: key → the sha256 the controller
    would write; the host sends the old content back only when it differs ("always": always).
    `checks`: name → shell command whose exit status is the fact.  `lock_acquire` takes the
    host lock first (and gathers nothing if it is held); `lock_peek` only reads it."""
    files: List[str] = LIST
    content: Dict[str, str] = DICT
    units: List[str] = LIST
    venvs: List[str] = LIST
    listdirs: List[str] = LIST
    checks: Dict[str, str] = DICT
    weights: List[str] = LIST
    gpu: bool = False
    allow_shared_dirs: List[str] = LIST
    lock_peek: bool = False
    lock_acquire: Optional[Holder] = None
    break_lock: bool = False
    Result = ProbeResult


@message
class ApplyResult:
    """ok, or the index of the action that `failed` and why; `results` [{index, out}] of the done ones."""
    ok: bool
    results: List[Dict[str, Any]] = LIST
    failed: Optional[int] = None
    error: Optional[str] = None


@request("apply")
class Apply:
    """Execute a batch: stage and validate every write, run every check, then change things in order.
    `allow_shared_dirs`: directories others can write to where writing is allowed anyway."""
    actions: List[Action]
    allow_shared_dirs: List[str] = LIST
    Result = ApplyResult


@request("check")
class Check:
    """Check mode: run the batch's read-only checks (CHECK_KINDS) for real, change nothing."""
    actions: List[Action]
    Result = ApplyResult


@message
class VerifyResult:
    """One report per service asked about, in the same order."""
    services: List[ServiceReport]


@request("verify")
class Verify:
    """Wait for each service to be ready, then compare what runs with what was intended."""
    services: List[ServiceCheck]
    Result = VerifyResult


@request("peek")
class Peek:
    """The running services' effective arguments against the intended ones; no waiting."""
    services: List[ServiceCheck]
    Result = VerifyResult


@message
class RenewResult:
    """Whether the token still holds the lock (its lease renewed), and who holds it if not."""
    held: bool
    holder: Optional[Dict[str, Any]] = None


@request("renew")
class Renew:
    """Renew the lease of the lock `token` holds (a long run does this while it waits)."""
    token: str
    Result = RenewResult


@message
class UnlockResult:
    """Whether the token still held the lock and gave it back; `running`: the pids of commands
    the run started that had not ended after lock.RELEASE_WAIT (the lock is kept then; 0 is a
    pid /proc did not show)."""
    released: bool
    running: List[int] = LIST


@request("unlock")
class Unlock:
    """Give the lock back, if `token` still holds it."""
    token: str
    Result = UnlockResult


@message
class StopReport:
    """One unit stopped: leftovers `killed`, GPU memory freed per GPU index, what is `left`
    on the GPUs (attributed to no unit, or not killable), and the failures that make stop fail."""
    name: str
    seconds: float
    killed: List[Process] = LIST
    freed_mib: Dict[str, Optional[int]] = DICT
    left: List[Process] = LIST
    failures: List[str] = LIST
    # seconds systemctl stop waited when the server outlived TimeoutStopSec and systemd killed it
    timed_out: Optional[float] = None
    # systemd's Result when the unit became "failed" during this stop and was left so (a single-node
    # unit whose run ended with a failure as it was stopped, a crash; or one killed at its timeout)
    left_failed: Optional[str] = None


@message
class StopResult:
    """A report per stopped unit, and each GPU's memory in use afterwards (None: not reported)."""
    services: List[StopReport]
    gpus: Dict[str, Optional[int]] = DICT


@request("stop")
class Stop:
    """Stop units, kill what of their runs still lives, prove their GPU memory free.  `others`:
    the host's other units, whose processes may keep holding GPU memory."""
    services: List[UnitRef]
    others: List[str] = LIST
    Result = StopResult


@message
class StartResult:
    """The units started, and how the current release says to verify them (None before any)."""
    started: List[str]
    verify: Optional[List[ServiceCheck]] = None


@request("start")
class Start:
    """Start units again (after stop or a GPU window), accounting for leftovers first."""
    services: List[UnitRef]
    Result = StartResult


@message
class RecordResult:
    """The release recorded, and how many managed files it snapshotted."""
    stamp: str
    files: int


@request("release_record")
class ReleaseRecord:
    """After a deploy: snapshot every `managed` file into releases/<stamp>/files, note what each
    replaced path was before (`previous`: path → "backup" | "absent"), write the manifest, and
    move `current` when the status is "deployed"."""
    stamp: str
    managed: List[str]
    previous: Dict[str, str]
    manifest: Dict[str, Any]
    status: str = "deployed"
    Result = RecordResult


@message
class ReleasesResult:
    """current stamp, and every release [{stamp, status, services, current, summary, spec,
    verify (the checks), verified (what verify found: name, checks, generate, notes),
    packages, files: {path: sha256}, perf: {service: spec-bench result} or None}]."""
    current: Optional[str]
    releases: List[Dict[str, Any]]


@request("releases")
class Releases:
    """List the host's releases, oldest first."""
    Result = ReleasesResult


@message
class UndoResult:
    """Files put back, the release now current, and how it says to verify (None: first deploy)."""
    restored: List[str]
    current: Optional[str]
    verify: Optional[List[ServiceCheck]] = None


@request("undo")
class Undo:
    """Undo a deploy whose verify failed: its own backups back, created files removed, restart."""
    stamp: str
    previous: Dict[str, str]
    services: List[UnitRef]
    allow_shared_dirs: List[str] = LIST
    Result = UndoResult


@message
class RollbackResult:
    """The release now current (`to`), the one it replaced, the files put back, how to verify."""
    to: str
    replaced: Optional[str]
    restored: List[str]
    verify: List[ServiceCheck] = LIST


@request("rollback")
class Rollback:
    """Back to the release before current (or `to`): files, bytecode purge, reload, restart."""
    to: Optional[str] = None
    services: List[UnitRef] = LIST
    allow_shared_dirs: List[str] = LIST
    Result = RollbackResult




@message
class PeerKeyResult:
    """A key made for one copy: its id, its public half (the private one never leaves the host),
    the peer's numeric `address` as the host resolved it, and the address the host reaches it
    from (`source`: what the peer's sshd will see)."""
    id: str
    public_key: str
    source: str
    address: str


@request("peer_key")
class PeerKey:
    """Make a key for one copy from the peer at `address`:`port` (and sweep one a killed run left)."""
    address: str
    port: int = 22
    Result = PeerKeyResult


@message
class PeerCopyResult:
    """Bytes rsync `received`, the files it `copied` (the others were already there), how many `files` now."""
    received: int
    copied: List[str]
    files: int


@request("peer_copy")
class PeerCopy:
    """Copy the peer's `path` into `dest` with rsync over SSH, with the key `id` made by PeerKey,
    as `user`@`address`:`port`, whose host key must be `host_key` (the one the controller checked);
    refused before any byte moves when the disk cannot hold `files` (name → [size, mtime_ns], as the
    peer listed them).  `verify`: compare every file by checksum.  Then the files that moved are
    hashed and the manifest written with `source`.  The key is removed however the copy ends."""
    id: str
    user: str
    address: str
    port: int
    host_key: str
    path: str
    dest: str
    files: Dict[str, List[int]]
    source: Dict[str, Any]
    source_address: str = ""
    peer: str = ""  # the peer's inventory name, for messages
    verify: bool = False
    Result = PeerCopyResult


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
    """Drive `service` on the host with the load client (agent/specbench.py): per level of
    `concurrency`, `warmup` requests, then `requests` streaming requests of `max_new_tokens`
    from closed-loop clients, the prompts cycled in an order fixed by `seed`."""
    service: ServiceCheck
    prompts: List[str]
    concurrency: List[int] = Factory(lambda: [1, 8, 32])
    requests: int = 64
    warmup: int = 4
    max_new_tokens: int = 128
    seed: int = 0
    unit: Optional[str] = None  # the unit that must be listening on the port (default: the service's)
    Result = SpecBenchResult


@message
class BaselineResult:
    """The transient unit that serves the baseline (stop it with a Stop of its UnitRef)."""
    unit: str


@request("baseline_start")
class BaselineStart:
    """Inside a GPU window: run `argv` (the service's command minus its speculative flags) as the
    transient unit specops-baseline-<service>, with the service's env file, `env` and `user`,
    and wait until `ready` answers 200 on `host`:`port` (at most `timeout` s).  `properties`:
    the managed unit's settings the server needs too (TimeoutStopSec, LimitNOFILE)."""
    service: str
    argv: List[str]
    port: int
    host: str = "127.0.0.1"
    ready: str = "/health"
    env: Dict[str, str] = DICT
    user: Optional[str] = None
    gpus: Optional[List[int]] = None
    timeout: float = 3600
    properties: Dict[str, str] = DICT
    Result = BaselineResult


@request("perf_record")
class PerfRecord:
    """Keep a spec-bench result (`perf`: its service, figures, speedups, arguments, versions) in
    the perf.json of release `stamp` (the current one when None), beside other services' results."""
    perf: Dict[str, Any]
    stamp: Optional[str] = None
    Result = RecordResult

