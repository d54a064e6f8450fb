"""The messages between the controller and the agent on a host.

Both sides import this module (the agent carries it in its zip).  A request is one
SSH round trip: the controller sends ``encode(request)`` as JSON on the agent's stdin,
and the agent answers ``{"ok": true, "result": {...}}`` (the request's ``Result``
type) or ``{"ok": false, "error": "one line"}``.  On the wire every request and every
action is a JSON object whose ``kind`` names its class here; ``decode`` refuses an
unknown kind, a missing field or an unexpected one with a one-line ProtocolError that
names it.  Any request may also carry ``unlock``: the lock token to give back when it
ends, so a run's last call needs no round trip of its own.

Standard library only; runs on the host's python3 (3.8+).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


class ProtocolError(ValueError):
    """A message that is not one of ours: unknown kind, missing or unexpected field."""


_REQUESTS: Dict[str, type] = {}
_ACTIONS: Dict[str, type] = {}
_NESTED: Dict[str, Any] = {}  # "Class.field" → decoder for the nested messages of that field


def _message(registry: Dict[str, type], kind: str):
    def wrap(cls):
        cls = dataclass(cls)
        cls.KIND = kind
        registry[kind] = cls
        return cls
    return wrap


def request(kind: str):
    """A request kind: one round trip, answered with ``cls.Result``."""
    return _message(_REQUESTS, kind)


def action(kind: str):
    """An action kind, as an apply (or check) batch carries it."""
    return _message(_ACTIONS, kind)


def encode(msg: Any, **envelope: Any) -> dict:
    """A message as its wire dict: its fields, nested messages as dicts, plus ``kind``."""
    out = {"kind": msg.KIND} if hasattr(msg, "KIND") else {}
    for f in dataclasses.fields(msg):
        out[f.name] = _encode_value(getattr(msg, f.name))
    out.update({k: v for k, v in envelope.items() if v is not None})
    return out


def _encode_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return encode(value)
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode_value(v) for k, v in value.items()}
    return value


def fields_of(cls: type, data: Any, what: str) -> Any:
    """Build a dataclass from a wire dict, refusing missing and unexpected fields."""
    if not isinstance(data, dict):
        raise ProtocolError("%s: expected an object, got %s" % (what, type(data).__name__))
    known = {f.name: f for f in dataclasses.fields(cls)}
    extra = sorted(set(data) - set(known) - {"kind"})
    if extra:
        raise ProtocolError("%s: unexpected field %r" % (what, extra[0]))
    values = {}
    for name, f in known.items():
        if name in data:
            nested = _NESTED.get("%s.%s" % (cls.__name__, name))
            values[name] = nested(data[name], "%s.%s" % (what, name)) if nested else data[name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError("%s: missing field %r" % (what, name))
    return cls(**values)


def _decode_kind(registry: Dict[str, type], family: str, data: Any, what: str) -> Any:
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in registry:
        raise ProtocolError("%s: unknown %s kind %r (known: %s)" % (what, family, kind, ", ".join(sorted(registry))))
    return fields_of(registry[kind], data, "%s %s" % (family, kind))


def decode_request(data: Any) -> Any:
    """The request in a wire dict (the envelope's ``unlock`` is read by the caller)."""
    body = dict(data) if isinstance(data, dict) else data
    if isinstance(body, dict):
        body.pop("unlock", None)
    return _decode_kind(_REQUESTS, "request", body, "request")


def decode_action(data: Any, what: str = "action") -> Any:
    return _decode_kind(_ACTIONS, "action", data, what)


def decode_result(request_msg: Any, answer: Any) -> Any:
    """The agent's answer to `request_msg`: its Result, or AgentError with the agent's line."""
    if not isinstance(answer, dict) or "ok" not in answer:
        raise ProtocolError("answer to %s: not an envelope" % request_msg.KIND)
    if not answer["ok"]:
        raise AgentError(answer.get("error") or "the agent failed without saying why")
    return fields_of(request_msg.Result, answer.get("result"), "answer to %s" % request_msg.KIND)


class AgentError(Exception):
    """The agent refused or failed a request; the message is its one line."""


def _nested(owner: str, decoder):
    _NESTED[owner] = decoder


def _list_of(cls):
    return lambda items, what: [fields_of(cls, x, "%s[%d]" % (what, i)) for i, x in enumerate(items or [])]


def _actions(items, what):
    return [decode_action(x, "%s[%d]" % (what, i)) for i, x in enumerate(items or [])]


# ---- shared parts ----

@dataclass
class Holder:
    """Who holds a host's lock, shown to anyone refused by it.  `token` proves it is ours."""
    who: str
    pid: int
    task: str
    since: str
    token: str


@dataclass
class UnitRef:
    """A systemd service specops runs, with what stop needs to account for its processes:
    `grace` seconds between SIGTERM and SIGKILL for leftovers, `settle` seconds to let the
    unit's processes release the GPUs, `titles` the process-title prefixes of its kind
    (used to describe processes, never to attribute them)."""
    name: str
    grace: float = 10
    settle: float = 3
    titles: List[str] = field(default_factory=list)


@dataclass
class Endpoints:
    """How to ask a kind of service over HTTP: ready (200 when serving), its effective
    arguments (`info`, then `info_fallback` on 404), the models it serves, a generation."""
    ready: str = "/health"
    info: str = "/server_info"
    info_fallback: Optional[str] = "/get_server_info"
    models: Optional[str] = "/v1/models"
    generate: Optional[str] = "/generate"
    public: List[str] = field(default_factory=lambda: ["/health"])  # paths that need no API key


@dataclass
class ServiceCheck:
    """How verify checks one service; stored in each release's manifest (no secrets: the agent
    reads the API key from the service's env file)."""
    name: str
    port: int
    host: str = "127.0.0.1"
    served_model_name: Optional[str] = None
    intended: Dict[str, Any] = field(default_factory=dict)
    accepted: Dict[str, Any] = field(default_factory=dict)
    timeout: float = 600
    prompt: str = "The capital of France is"
    max_new_tokens: int = 32
    min_accept_length: Optional[float] = None
    baseline_tok_s: Optional[float] = None
    managed: List[str] = field(default_factory=list)
    endpoints: Endpoints = field(default_factory=Endpoints)
    generate_body: Dict[str, Any] = field(default_factory=dict)  # {"text"/"sampling_params"}; prompt filled in


_nested("ServiceCheck.endpoints", lambda d, what: fields_of(Endpoints, d, what))


@dataclass
class ServiceReport:
    """What verify (or peek) found for one service; `failures` empty means verified."""
    name: str
    failures: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    checks: List[str] = field(default_factory=list)
    effective: Optional[Dict[str, Any]] = None
    generate: Optional[Dict[str, Any]] = None
    journal: Optional[str] = None
    ready_after: Optional[float] = None
    health_statuses: List[Any] = field(default_factory=list)
    stale: bool = False


@dataclass
class Process:
    """A process holding GPU memory, or one specops killed: pid, its (cleaned) title and user,
    MiB held (None when nvidia-smi cannot tell), and the unit it belongs to, if any."""
    pid: int
    title: str = ""
    user: str = ""
    mib: Optional[int] = None
    unit: Optional[str] = None
    signal: Optional[str] = None


# ---- actions: what an apply batch does, in order; `desc` is the progress line ----

@action("write")
class Write:
    """Replace a file: staged and validated (`validate` argv, {} is the staged path) before
    anything in the batch changes, the old content kept at `backup`, then renamed into place."""
    path: str
    data: str  # base64
    mode: str = "0644"
    owner: Optional[str] = "root"
    group: Optional[str] = "root"
    validate: Optional[List[str]] = None
    validator: Optional[str] = None
    label: Optional[str] = None
    backup: Optional[str] = None
    desc: str = ""


@action("mkdir")
class Mkdir:
    """Create a directory (or fix its mode and owner)."""
    path: str
    mode: str = "0755"
    owner: Optional[str] = "root"
    group: Optional[str] = "root"
    desc: str = ""


@action("attrs")
class Attrs:
    """Set mode and owner of an existing path."""
    path: str
    mode: Optional[str] = None
    owner: Optional[str] = None
    group: Optional[str] = None
    desc: str = ""


@action("remove")
class Remove:
    """Remove a path, keeping it at `backup` first."""
    path: str
    backup: Optional[str] = None
    desc: str = ""


@action("purge")
class Purge:
    """Remove every cached bytecode of a module source and record the purge (content sha256)."""
    path: str
    sha256: str
    desc: str = ""


@action("run")
class Run:
    """Run a command (argv list, or a shell string), streaming its output; non-zero fails the batch."""
    cmd: Any
    desc: str = ""


@action("daemon-reload")
class DaemonReload:
    """systemctl daemon-reload: a handler, run once, before any restart."""
    desc: str = "daemon-reload"


@action("restart")
class Restart:
    """Stop a unit, account for every process of its runs still alive (killing leftovers),
    then start it: how every restart path restarts."""
    unit: UnitRef
    desc: str = ""


_nested("Restart.unit", lambda d, what: fields_of(UnitRef, d, what))


@action("preflight")
class Preflight:
    """A check that changes nothing: the installed SGLang resolves `argv` (script run by
    `python`) and must report the `expect`ed values.  Runs before anything in a batch."""
    python: str
    script: str
    argv: List[str]
    expect: Dict[str, Any]
    service: str
    desc: str = ""


@action("expect")
class Expect:
    """Run `code` with `python`; its JSON answer must hold the `expect`ed values (after an install)."""
    python: str
    code: str
    expect: Dict[str, Any]
    what: str
    desc: str = ""


CHECK_KINDS = ("preflight",)  # actions that change nothing, so check mode runs them for real


# ---- requests ----

@dataclass
class ProbeResult:
    """The facts.  files: key → {path, exists, type, sha256, size, mtime, mode, owner, group,
    content_b64 (when asked and different), pycache [{name, mtime}], unresolved};
    units: name → systemctl show properties (+ text, the unit file); venvs: path → {exists,
    python, version, tag, packages, dirs, torch_cuda, broken}; gpu: {present, gpus [{index,
    uuid, name, driver_version, memory.total, memory.used (None when unknown)}], apps
    [Process], driver, unknown [fields nvidia-smi could not report], error};
    lock: {acquired, token, holder} when taken, {held, holder} when peeked."""
    time: float
    hostname: str
    python: str
    files: Dict[str, Any] = field(default_factory=dict)
    units: Dict[str, Any] = field(default_factory=dict)
    venvs: Dict[str, Any] = field(default_factory=dict)
    listings: Dict[str, Dict[str, int]] = field(default_factory=dict)
    checks: Dict[str, int] = field(default_factory=dict)
    gpu: Optional[Dict[str, Any]] = None
    lock: Optional[Dict[str, Any]] = None


@request("probe")
class Probe:
    """Gather every fact a plan needs in one pass.  `content`: key → the sha256 the controller
    would write; the host sends the old content back only when it differs ("always": always).
    `checks`: name → shell command whose exit status is the fact.  `lock_acquire` takes the
    host lock first (and gathers nothing if it is held); `lock_peek` only reads it."""
    files: List[str] = field(default_factory=list)
    content: Dict[str, str] = field(default_factory=dict)
    units: List[str] = field(default_factory=list)
    venvs: List[str] = field(default_factory=list)
    listdirs: List[str] = field(default_factory=list)
    checks: Dict[str, str] = field(default_factory=dict)
    gpu: bool = False
    lock_peek: bool = False
    lock_acquire: Optional[Holder] = None
    break_lock: bool = False
    Result = ProbeResult


_nested("Probe.lock_acquire", lambda d, what: None if d is None else fields_of(Holder, d, what))


@dataclass
class ApplyResult:
    """ok, or the index of the action that `failed` and why; `results` [{index, out}] of the done ones."""
    ok: bool
    results: List[Dict[str, Any]] = field(default_factory=list)
    failed: Optional[int] = None
    error: Optional[str] = None


@request("apply")
class Apply:
    """Execute a batch: stage and validate every write, run every check, then change things in order."""
    actions: List[Any]
    Result = ApplyResult


@request("check")
class Check:
    """Check mode: run the batch's read-only checks (CHECK_KINDS) for real, change nothing."""
    actions: List[Any]
    Result = ApplyResult


_nested("Apply.actions", _actions)
_nested("Check.actions", _actions)


@dataclass
class VerifyResult:
    services: List[ServiceReport]


_nested("VerifyResult.services", _list_of(ServiceReport))


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


_nested("Verify.services", _list_of(ServiceCheck))
_nested("Peek.services", _list_of(ServiceCheck))


@dataclass
class UnlockResult:
    released: bool


@request("unlock")
class Unlock:
    """Give the lock back, if `token` still holds it."""
    token: str
    Result = UnlockResult


@dataclass
class StopReport:
    """One unit stopped: leftovers `killed`, GPU memory freed per GPU index, what is `left`
    on the GPUs (attributed to no unit, or not killable), and the failures that make stop fail."""
    name: str
    seconds: float
    killed: List[Process] = field(default_factory=list)
    freed_mib: Dict[str, Optional[int]] = field(default_factory=dict)
    left: List[Process] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)


_nested("StopReport.killed", _list_of(Process))
_nested("StopReport.left", _list_of(Process))


@dataclass
class StopResult:
    services: List[StopReport]
    gpus: Dict[str, Optional[int]] = field(default_factory=dict)


_nested("StopResult.services", _list_of(StopReport))


@request("stop")
class Stop:
    """Stop units, kill what of their runs still lives, prove their GPU memory free.  `others`:
    the host's other units, whose processes may keep holding GPU memory."""
    services: List[UnitRef]
    others: List[str] = field(default_factory=list)
    Result = StopResult


@dataclass
class StartResult:
    """The units started, and how the current release says to verify them (None before any)."""
    started: List[str]
    verify: Optional[List[ServiceCheck]] = None


_nested("StartResult.verify", lambda d, what: None if d is None else _list_of(ServiceCheck)(d, what))


@request("start")
class Start:
    """Start units again (after stop or a GPU window), accounting for leftovers first."""
    services: List[UnitRef]
    Result = StartResult


_nested("Stop.services", _list_of(UnitRef))
_nested("Start.services", _list_of(UnitRef))


@dataclass
class RecordResult:
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


@dataclass
class ReleasesResult:
    """current stamp, and every release [{stamp, status, services, files, current, summary, verify}]."""
    current: Optional[str]
    releases: List[Dict[str, Any]]


@request("releases")
class Releases:
    """List the host's releases, oldest first."""
    Result = ReleasesResult


@dataclass
class UndoResult:
    """Files put back, the release now current, and how it says to verify (None: first deploy)."""
    restored: List[str]
    current: Optional[str]
    verify: Optional[List[ServiceCheck]] = None


_nested("UndoResult.verify", lambda d, what: None if d is None else _list_of(ServiceCheck)(d, what))


@request("undo")
class Undo:
    """Undo a deploy whose verify failed: its own backups back, created files removed, restart."""
    stamp: str
    previous: Dict[str, str]
    services: List[UnitRef]
    Result = UndoResult


@dataclass
class RollbackResult:
    to: str
    replaced: Optional[str]
    restored: List[str]
    verify: List[ServiceCheck] = field(default_factory=list)


_nested("RollbackResult.verify", _list_of(ServiceCheck))


@request("rollback")
class Rollback:
    """Back to the release before current (or `to`): files, bytecode purge, reload, restart."""
    to: Optional[str] = None
    services: List[UnitRef] = field(default_factory=list)
    Result = RollbackResult


_nested("Undo.services", _list_of(UnitRef))
_nested("Rollback.services", _list_of(UnitRef))

REQUEST_KINDS = tuple(sorted(_REQUESTS))
ACTION_KINDS = tuple(sorted(_ACTIONS))
