"""The engine's contract with ops: facts in, a Change out.

An op states a desired state.  ``wants()`` says which facts it needs (a partial
protocol.Probe; the run merges every op's into one probe); ``plan(facts, ctx)``
compares and returns a Change: the actions that close the gap (none when there is
none), the read-only checks to run first, and the handlers to notify.  ``plan`` also
tells the Facts what the host will look like, so later ops plan against that.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from . import handlers
from .. import protocol
from ..errors import SpecopsError


class PlanError(SpecopsError):
    """The desired state cannot be reached from these facts."""


@dataclass
class Change:
    """What an op found: `actions` change the host, `checks` only ask it (they run first and
    change nothing), `notify` asks for handlers.  Changed means something will change."""
    role: str
    target: str
    summary: str
    services: tuple = ()  # the services this change concerns
    actions: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    notify: list = field(default_factory=list)
    diff: str = ""
    warning: str = ""  # shown even when nothing changes
    uploads: list = field(default_factory=list)  # (local, remote[, offset to resume at]): pushed before the batch
    copies: list = field(default_factory=list)   # peercopy.PeerCopy: host-to-host copies, run before the batch
    stale: bool = False  # a restart because the service runs code older than its files
    fails: str = ""  # what the facts already show this change may fail at (check mode says it, and fails)

    @property
    def changed(self) -> bool:
        return bool(self.actions or self.notify or self.uploads or self.copies)

    @property
    def moves(self) -> bool:
        """Whether the controller moves bytes onto the host before the batch (what later roles read)."""
        return bool(self.uploads or self.copies)

    def record(self, host: str) -> dict:
        return {"host": host, "role": self.role, "target": self.target, "changed": self.changed,
                "summary": self.summary, "diff": self.diff, "warning": self.warning,
                "services": list(self.services), "stale": self.stale, "fails": self.fails}


class Facts:
    """The probe's answer (a protocol.ProbeResult as a dict), with the accessors ops need."""

    def __init__(self, data: dict):
        self.data = data
        # Files' content as parsed by the ops that read it (code.host_state), with the content it
        # was parsed from; held by these facts, so it never outlives the probe that sent it.
        self.parsed: dict[str, tuple[str, Any]] = {}

    @classmethod
    def of(cls, result: protocol.ProbeResult) -> "Facts":
        return cls(protocol.to_dict(result))

    def file(self, key: str) -> dict:
        return self.data["files"][key]

    def unit(self, name: str) -> dict:
        return self.data["units"].get(name, {})

    def venv(self, path: str) -> dict:
        return self.data["venvs"].get(path, {"exists": False})

    def listing(self, directory: str) -> dict[str, int]:
        """name → size of the files in a directory."""
        return (self.data.get("listings") or {}).get(directory, {})

    def weight_listing(self, directory: str) -> dict[str, int]:
        """name → bytes on disk of a checkpoint's weight files (probe.weight_listing)."""
        return (self.data.get("weight_listings") or {}).get(directory, {})

    def upstream(self, key: str) -> dict:
        return (self.data.get("upstream") or {}).get(key) or {}

    @property
    def stacks(self) -> list[dict]:
        return self.data.get("stacks") or []

    def check(self, name: str) -> int:
        return self.data["checks"][name]

    def package(self, name: str) -> int:
        """protocol.INSTALLED, CANDIDATE or NO_CANDIDATE."""
        return self.data["packages"][name]

    @property
    def gpu(self) -> dict:
        return self.data.get("gpu") or {"present": False}

    def assume_file(self, key: str, **fact: Any) -> None:
        """After this plan the file at `key` will look like this (merged into what is there)."""
        self.data["files"][key] = {**self.data["files"].get(key, {}), **fact}
        self.data.setdefault("assumed", {})[key] = self.data["files"][key]

    def carrying(self, before: "Facts") -> "Facts":
        """These facts (a probe after some of the plan was applied) with what the earlier plan
        assumed of files its batch has not written yet (their switch comes with the last batch)."""
        assumed = before.data.get("assumed") or {}
        self.data["files"].update(assumed)
        self.data["assumed"] = dict(assumed)
        return self

    def assume_venv(self, path: str, fact: dict) -> None:
        self.data["venvs"][path] = fact


@dataclass
class Context:
    host: str
    check: bool
    notified: list = field(default_factory=list)
    release_dir: str | None = None  # where replaced files are backed up (releases)
    verify_weights: bool = False    # --verify-weights: hash the weights, not only stat them
    reserved: dict = field(default_factory=dict)  # filesystem → bytes earlier pushes of this run will take


def merge_wants(parts: list[protocol.Probe]) -> protocol.Probe:
    """One probe for every op: lists unioned in order, mappings merged, flags or'ed."""
    out = protocol.Probe()
    for w in parts:
        for k in ("files", "units", "venvs", "listdirs", "weight_dirs", "weights", "upstream", "gpu_units", "packages"):
            getattr(out, k).extend(x for x in getattr(w, k) if x not in getattr(out, k))
        out.content.update(w.content)
        out.checks.update(w.checks)
        out.gpu = out.gpu or w.gpu
        out.gpu_apps = out.gpu_apps or w.gpu_apps
        out.stacks = out.stacks or w.stacks
        if w.wheel_files and out.wheel_files and w.wheel_files != out.wheel_files:
            # One request per probe (the agent reads one wheel): a second would be silently dropped.
            raise ValueError("two ops want files of different wheels in one probe: %r and %r"
                             % (out.wheel_files, w.wheel_files))
        out.wheel_files = out.wheel_files or w.wheel_files
        out.lock_peek = out.lock_peek or w.lock_peek
    return out


def unified_diff(old: bytes | None, new: bytes, name: str) -> str:
    """What --diff and the JSON report show of a file: computed once per run for every host whose
    file is the same (difflib takes ~50 ms on a 180 KB model file)."""
    key = (hashlib.sha256(old or b"").digest(), hashlib.sha256(new).digest(), old is None, name)
    with _DIFFS_LOCK:
        if key not in _DIFFS:
            _DIFFS[key] = _unified_diff(old, new, name)
        return _DIFFS[key]


_DIFFS: dict = {}
_DIFFS_LOCK = threading.Lock()


def _unified_diff(old: bytes | None, new: bytes, name: str) -> str:
    import difflib  # only a run that changes a file
    if old is None:
        old = b""
    try:
        a, b = old.decode().splitlines(True), new.decode().splitlines(True)
    except UnicodeDecodeError:
        return f"binary {name}: {len(old)} → {len(new)} bytes\n"
    return "".join(difflib.unified_diff(a, b, f"{name} (host)", f"{name} (desired)", n=2))


class Op:
    """Base of every op.  `role` is set by the run; `notify` are the handlers a change asks for;
    `services` the services a change concerns (by default, those its handlers restart)."""
    role = ""
    notify: tuple = ()
    services: tuple = ()

    def wants(self) -> protocol.Probe:
        return protocol.Probe()

    def plan(self, facts: Facts, ctx: Context) -> Change:
        raise NotImplementedError

    def _change(self, target: str, summary: str, actions=(), diff="", notify=None, checks=()) -> Change:
        """A Change: notify only when something changes (unless told otherwise)."""
        if notify is None:
            notify = self.notify if actions else ()
        services = self.services or tuple(handlers.restarts(self.notify))
        return Change(self.role, target, summary, services, list(actions), list(checks), list(notify), diff)
