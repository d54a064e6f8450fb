"""The actions an apply batch carries, each with the phase the agent runs it in (agent/converge/
stage.py), and the kinds that check mode runs and that reach a running service."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, List, Optional  # noqa: F401

from .parts import UnitRef  # noqa: F401  (named in annotations: wire.py resolves them by name)
from .wire import DICT, LIST, action

Action = "any of the action messages below (a field annotated List[Action] holds them, each with its kind)"


# `desc` is each one's progress line.
# A batch runs in three phases, whatever order its actions came in (agent/converge/stage.py):
# CHECK asks and changes nothing; PREPARE may fail, and changes nothing that serves (installs
# beside it, builds, fetches, directories; none is undone, and nothing points at what it made
# yet); SWITCH changes what serves (renames, enable, reload, restarts), journaled, and undone
# from the release's backups when it fails.
CHECK, PREPARE, SWITCH = "check", "prepare", "switch"
PHASES = (CHECK, PREPARE, SWITCH)

@action("write", SWITCH)
class Write:
    """Replace a file: staged and validated before anything in the batch changes, the old content
    kept at `backup`, then renamed into place.  `validate` is an argv whose last word is {} (the
    staged path) or {}... (the batch's writes with the same validator are checked in one run).
    `bytecode`: what such a validator would have compiled, made by the controller instead
    (ops.code.precompiled), installed by the purge that follows as the validator's would be."""
    path: str
    data: str  # base64
    mode: str = "0644"
    owner: Optional[str] = "root"
    group: Optional[str] = "root"
    validate: Optional[List[str]] = None
    validator: Optional[str] = None
    label: Optional[str] = None
    backup: Optional[str] = None
    bytecode: Optional[List[str]] = None  # [.pyc name, base64]: compiled by the controller for this interpreter
    desc: str = ""


@action("mkdir", PREPARE)
class Mkdir:
    """Create a directory (or fix its mode and owner)."""
    path: str
    mode: str = "0755"
    owner: Optional[str] = "root"
    group: Optional[str] = "root"
    desc: str = ""


@action("attrs", PREPARE)
class Attrs:
    """Set mode and owner of an existing path."""
    path: str
    mode: Optional[str] = None
    owner: Optional[str] = None
    group: Optional[str] = None
    desc: str = ""


@action("remove", SWITCH)
class Remove:
    """Remove a path, keeping it at `backup` first."""
    path: str
    backup: Optional[str] = None
    desc: str = ""


@action("purge", SWITCH)
class Purge:
    """Remove every cached bytecode of a module source and record the purge (content sha256)."""
    path: str
    sha256: str
    desc: str = ""


@action("run", PREPARE)
class Run:
    """Run a command (argv list, or a shell string), streaming its output; non-zero fails the batch.
    It prepares (a venv, a system user): nothing that serves points at what it makes yet."""
    cmd: Any
    desc: str = ""


@action("apt-install", PREPARE)
class AptInstall:
    """apt-get update, then install `packages` (Recommends left out).  Never removed, by an undo
    either: installed before anything that serves points at them."""
    packages: List[str]
    desc: str = ""


@action("dpkg-install", PREPARE)
class DpkgInstall:
    """Install the .deb the controller pushed to `path` (its `sha256` checked, and that it is
    `package`) with dpkg -i, then remove it; a failed install is purged: no half-configured
    package stays.  Never removed by an undo (like AptInstall)."""
    path: str
    sha256: str
    package: str
    desc: str = ""


@action("enable", SWITCH)
class Enable:
    """Enable a unit (`enable` false: disable it), starting it too with `now`.  `was`: its
    UnitFileState before, which an undo puts back when it was enabled, disabled or none (a unit
    this deploy enabled is disabled again, and stopped if `now` started it; one that was enabled
    and only started is left running)."""
    unit: str
    enable: bool = True
    now: bool = False
    was: Optional[str] = None
    desc: str = ""


@action("pip-install", PREPARE)
class PipInstall:
    """pip installs `specs` (requirements, after `--`) into the venv of `python`; `sources`: pip's
    index arguments (--index-url URL ...), which reach pip in its environment, never its command
    line (agent/converge/installs.py)."""
    python: str
    specs: List[str]
    sources: List[str] = LIST
    desc: str = ""


@action("daemon-reload", SWITCH)
class DaemonReload:
    """systemctl daemon-reload: a handler, run once, before any restart.  With `units` (the
    unit files whose change asked for it), only when systemd does not already have each of
    them as written (agent.services.units.daemon_reload)."""
    units: List[str] = LIST
    desc: str = "daemon-reload"


@action("restart", SWITCH)
class Restart:
    """Stop a unit, account for every process of its runs still alive (killing leftovers),
    then start it: how every restart path restarts.  `others`: the host's other units, whose
    processes keep their GPU memory."""
    unit: UnitRef
    others: List[str] = LIST
    desc: str = ""


@action("start-unit", SWITCH)
class StartUnit:
    """Start a unit that is not running, after accounting for leftovers of its earlier runs."""
    unit: UnitRef
    others: List[str] = LIST
    desc: str = ""


@action("preflight", CHECK)
class Preflight:
    """A check that changes nothing: the installed SGLang resolves `argv` (script run by
    `python`) and must report the `expect`ed values.  Runs before anything in a batch."""
    python: str
    script: str
    argv: List[str]
    expect: Dict[str, Any]
    service: str
    desc: str = ""
    said_as: Dict[str, str] = DICT  # field -> its inventory key, for the words


@action("expect", PREPARE)
class Expect:
    """Run `code` with `python`; its JSON answer must hold the `expect`ed values (after an install)."""
    python: str
    code: str
    expect: Dict[str, Any]
    what: str
    desc: str = ""


@action("fetch-weights", PREPARE)
class FetchWeights:
    """Make `dest` hold a hub repository's files (`allow_patterns`) at the commit `revision`
    resolves to, with the real huggingface_hub client in a tool venv (pip with `pip_args`);
    refused before any byte moves when the disk cannot hold it.  `verify`: hash every file and
    fetch again those that differ.  `token` (the service's env_secret, also in its 0600 env file)
    goes into the client's environment only, never into a file of specops's or an argv: `source`
    is what the manifest keeps.  Its result: {commit, moved, fetched}."""
    dest: str
    repo: str
    revision: str
    source: Dict[str, Any]
    allow_patterns: Optional[List[str]] = None
    endpoint: Optional[str] = None
    token: Optional[str] = None
    token_env: str = "HF_TOKEN"
    pip_args: List[str] = LIST  # where the tool venv's pip finds huggingface_hub
    verify: bool = False
    desc: str = ""


@action("keep-upstream", PREPARE)
class KeepUpstream:
    """Keep an upstream file's content (base64 `data`) as layout.UPSTREAM_DIR/<sha256> before a
    diff patch replaces it, so the diff can be applied to it again.  Content-addressed: the agent
    refuses data of another sha256, and no undo or rollback removes it."""
    sha256: str
    data: str
    desc: str = ""


@action("build-stack", PREPARE)
class BuildStack:
    """Build the immutable venv `path` (layout.STACKS_DIR/<key>) with uv, beside the stack that
    serves: refused before anything moves when the disk has less than `need` bytes free; built in
    a directory of its own, checked (`expect`: what importing its packages must report, by the
    `check` code), described in its layout.STACK_FILE (`defines`), then renamed into place.
    `uv_pip_args`: where pip finds the pinned uv for its tool venv; `sources`: uv's index
    arguments; `specs`: the requirements.  Its result: {built, seconds, bytes}."""
    path: str
    python: str
    specs: List[str]
    sources: List[str]
    uv_pip_args: List[str]
    defines: Dict[str, Any]
    need: int
    check: str
    expect: Dict[str, Any]
    desc: str = ""


@action("record-weights", PREPARE)
class RecordWeights:
    """After weights were pushed from the controller into `dest`: check each file's size
    (`files`: name → size), hash the `pushed` ones against `expect`, and write the manifest."""
    dest: str
    source: Dict[str, Any]
    files: Dict[str, int]
    pushed: List[str] = LIST
    expect: Dict[str, str] = DICT  # pushed file → the sha256 of the controller's copy
    desc: str = ""


CHECK_KINDS = ("preflight",)  # actions that change nothing, so check mode runs them for real (phase CHECK)
# switch actions that reach a running service: a switch that began one is undone with a restart
RESTARTING = ("restart", "start-unit", "daemon-reload")


