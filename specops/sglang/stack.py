"""A host's Python stack: what defines it, and the immutable venv that holds it.

A stack is the interpreter, torch with its CUDA variant, fla, sglang and the other pins.
Each distinct one is a venv of its own, layout.STACKS_DIR/<key>, the key a hash of that
definition: a new SGLang is a new venv built beside the one that serves, a release names the
venv it runs, and rollback points the unit back at an older one without a pip call.  A host
whose inventory sets `venv:` manages that venv itself (pip in place, no rollback of packages);
so does a host that pins no package (it runs what is installed there).
"""
from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from ..layout import DEFAULT_VENV, STACKS_DIR, venv_python
from ..unitwords import interpreter

PINNED = (("flash-linear-attention", "fla"), ("sglang", "sglang"))  # a pinned distribution, and its host var
NAMED_BY = ("sglang", "torch", "flash-linear-attention")  # the versions a person names a stack by
PYPI = "https://pypi.org/simple"
GiB = 2**30
# The free disk a stack needs before it is built, unless the inventory says (stack_need_gib): a
# CUDA torch with SGLang's dependencies unpacks to several GB, and uv's cache holds them once more
# the first time; a stack whose torch is already in uv's cache costs links and the new packages.
NEED_FIRST_TORCH = 12 * GiB
NEED_OTHERWISE = 2 * GiB


def defines(host) -> dict | None:
    """What defines the host's stack (None: the host manages its venv, or pins nothing)."""
    if host.get("venv") or not any(host.get(k) for k in ("torch", "fla", "sglang", "packages")):
        return None
    torch = host.get("torch")
    return {"python": host.get("python") or "python3",
            "torch": {k: torch.get(k) for k in ("version", "cuda", "index_url")} if torch else None,
            **{dist: (host.get(var) or {}).get("version") for dist, var in PINNED},
            "packages": sorted(host.get("packages") or [])}


def key(definition: dict) -> str:
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]


def venv_of(host) -> str:
    """The venv a host's SGLang services run: its stack's, or the one it manages itself."""
    definition = defines(host)
    if definition is None:
        return host.get("venv", DEFAULT_VENV)
    return f"{STACKS_DIR}/{key(definition)}"


def venv_in_unit(unit_text: str | None) -> str | None:
    """The venv a unit runs: its ExecStart's interpreter less /bin/python; None when it runs no
    venv's python."""
    python = interpreter(unit_text) or ""
    suffix = venv_python("")
    return python[:-len(suffix)] if python.endswith(suffix) else None


def versions(packages: dict, before: dict | None = None, changed_only: bool = False) -> str:
    """"sglang 0.5.23 → 0.5.24, torch 2.9.1": what a person names a stack by (its hash says
    nothing), each with what it was in `before` where that differs; `changed_only`: only those."""
    def version(pkgs, dist):
        v = (pkgs or {}).get(dist)
        return str(v) if v and "failed" not in str(v) else None
    out = []
    for dist in NAMED_BY:
        now, then = version(packages, dist), version(before, dist)
        if now and then and now != then:
            out.append(f"{dist} {then} → {now}")
        elif now and not changed_only:
            out.append(f"{dist} {now}")
    return ", ".join(out)


def need(host, torch_in_cache: bool) -> int:
    if host.get("stack_need_gib") is not None:
        return int(float(host["stack_need_gib"]) * GiB)
    return NEED_OTHERWISE if torch_in_cache or not host.get("torch") else NEED_FIRST_TORCH


def wheel_request(host, files: list[str], version: str | None = None) -> dict:
    """A probe's `wheel_files` (agent/converge/wheelfiles.py): `files` (paths in the wheel) of
    sglang `version` (default: the host's), read in memory on the host from the indexes its
    stack is built from, while its stack is not built.  {} for a host with a wheelhouse: its
    stack is built from that alone, and the controller reads it there (wheel_files)."""
    if host.get("wheelhouse"):
        return {}
    indexes = [i for i in (host.get("extra_index"), host.get("package_index") or PYPI) if i]
    return {"stack": venv_of(host) if version is None else "", "dist": "sglang",
            "version": version or host["sglang"]["version"], "files": files, "indexes": indexes}


def wheel_files(host, files: list[str], answer: dict, version: str | None = None) -> dict[str, bytes | None]:
    """`files` of sglang `version` (default: the host's) from its wheel: the controller's
    wheelhouse where the host has one (and never an index then), else the probe's `answer` to
    wheel_request.  SourceError (one line: which source failed, and why) when it cannot be read."""
    from ..agent.converge import wheelfiles  # only here: urllib and zipfile are not every task's
    version = version or host["sglang"]["version"]
    if host.get("wheelhouse"):
        return wheelfiles.read("sglang", version, files, wheelhouse=str(Path(host["wheelhouse"]).expanduser()))
    if "error" in answer:
        raise wheelfiles.SourceError(answer["error"])
    return {f: None if answer.get(f) is None else base64.b64decode(answer[f]["content_b64"]) for f in files}
