"""A run's round trips: what is on the host (Probe), the batch that changes it (Apply),
the checks before (Check) and after (Verify, Peek) it."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, List, Optional  # noqa: F401

from .actions import Action  # noqa: F401
from .parts import Holder, Process, ServiceCheck, ServiceReport, UnitRef  # noqa: F401
from .wire import DICT, LIST, message, request


# A Debian package as a probe finds it: installed, else whether the host's own package lists have a
# candidate for it or not (Probe.packages).
INSTALLED, CANDIDATE, NO_CANDIDATE = 0, 1, 2


@message
class ProbeResult:
    """The facts.  files: key → {path, exists, type, sha256, size, mtime, mode, owner, group,
    content_b64 (when asked and different), pycache [{name, mtime}], unresolved};
    units: name → systemctl show properties (+ text, the unit file); venvs: path → {exists,
    python, version, tag, magic (importlib's MAGIC_NUMBER, hex), packages, dirs, torch_cuda, broken}; gpu: {present,
    gpus [{index,
    uuid, name, driver_version, memory.total, memory.used (None when unknown)}], apps
    [Process] (asked with gpu_apps), driver, unknown [fields nvidia-smi could not report], error};
    lock: {acquired, token, holder, running [an earlier run's commands]} when taken, {held, holder}
    when peeked; weights: dest →
    {manifest (or None), differ [files whose size or mtime moved], free (bytes)};
    stacks: [{path, defines, packages}] the complete stacks on the host; upstream: pkg key →
    {path, version (of its package), sha256 (what the package's RECORD says it installed),
    content_b64 (that upstream content, from the file or the kept copy; None when neither is),
    kept (the copy is in layout.UPSTREAM_DIR)}."""
    time: float
    hostname: str
    python: str
    files: Dict[str, Any] = DICT
    units: Dict[str, Any] = DICT
    venvs: Dict[str, Any] = DICT
    listings: Dict[str, Dict[str, int]] = DICT
    weight_listings: Dict[str, Dict[str, int]] = DICT
    checks: Dict[str, int] = DICT
    packages: Dict[str, int] = DICT
    weights: Dict[str, Any] = DICT
    stacks: List[Dict[str, Any]] = LIST
    stacks_free: Optional[int] = None  # free bytes where stacks are built (with `stacks`)
    upstream: Dict[str, Any] = DICT
    wheel_files: Dict[str, Any] = DICT  # path in the wheel → {sha256, content_b64} or None; {} when built; {error}
    gpu: Optional[Dict[str, Any]] = None
    lock: Optional[Dict[str, Any]] = None
    # a switch an earlier run was cut off in: {task, done, not_done (descs), undone (rollback.cut_off's
    # RecoverResult as a dict, when this run took the lock and undid it; else None)}
    interrupted: Optional[Dict[str, Any]] = None


@request("probe")
class Probe:
    """Gather every fact a plan needs in one pass.  `content`: key → the sha256 the controller
    would write; the host sends the old content back only when it differs ("always": always).
    `checks`: name → shell command whose exit status is the fact.  `upstream`: pkg keys whose
    installed upstream file (what a patch applies to) is wanted.  `wheel_files`: {stack, dist,
    version, files, indexes, wheelhouse}: while that stack is not built, those files of the
    dist's wheel, read in memory from the indexes or the wheelhouse.  `lock_acquire` takes the
    host lock first (and gathers nothing if it is held); `lock_peek` only reads it."""
    files: List[str] = LIST
    content: Dict[str, str] = DICT
    units: List[str] = LIST
    venvs: List[str] = LIST
    listdirs: List[str] = LIST
    weight_dirs: List[str] = LIST  # checkpoints: their weight files' bytes on disk (probe.weight_listing)
    checks: Dict[str, str] = DICT
    packages: List[str] = LIST  # Debian packages: INSTALLED, CANDIDATE or NO_CANDIDATE each (agent/converge/dpkg.py)
    weights: List[str] = LIST
    stacks: bool = False
    upstream: List[str] = LIST
    wheel_files: Dict[str, Any] = DICT
    gpu: bool = False
    gpu_apps: bool = False  # with gpu, nvidia-smi's compute apps too (a second call): status and facts show them
    gpu_units: List[str] = LIST  # SGLang's units: a kept GPU answer (gpus.for_plan) counts only their runs
    allow_shared_dirs: List[str] = LIST
    lock_peek: bool = False
    lock_acquire: Optional[Holder] = None
    break_lock: bool = False
    Result = ProbeResult


@message
class ApplyResult:
    """ok, or the index of the action that `failed`, why, and its `phase` (parts.PHASES: before
    the switch, nothing that serves was touched); `results` [{index, out}] of the done ones."""
    ok: bool
    results: List[Dict[str, Any]] = LIST
    failed: Optional[int] = None
    error: Optional[str] = None
    phase: Optional[str] = None


@request("apply", changes_host=True)
class Apply:
    """Execute a batch: stage and validate every write, run every check, then the preparations,
    then the switch, each in order (agent/converge/stage.py).  `stamp`: the release whose
    previous/ holds the switch's backups, `services` the host's units and `running` those that
    ran: what undoing a switch cut off needs (rollback.cut_off).  `allow_shared_dirs`: directories others can write
    to where
    writing is allowed anyway."""
    actions: List[Action]
    stamp: Optional[str] = None
    services: List[UnitRef] = LIST
    running: Optional[List[str]] = None  # of `services`, those active before this run changed anything
    concerned: Optional[List[str]] = None  # of `services`, those its switch concerns (None: every one)
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
    """Wait for each service to be ready, then compare what runs with what was intended.
    answer_within (seconds): answer then, with a service still starting reported `starting`;
    the next Verify, with resume, goes on with its wait (rank 0's, while the controller looks at
    the other ranks); without resume, a wait starts afresh."""
    services: List[ServiceCheck]
    answer_within: Optional[float] = None
    resume: bool = False
    Result = VerifyResult


@request("peek")
class Peek:
    """The running services' effective arguments against the intended ones; no waiting."""
    services: List[ServiceCheck]
    Result = VerifyResult
