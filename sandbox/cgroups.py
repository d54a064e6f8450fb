"""Each sandbox host's own cgroup subtree.

`systemd-nspawn --keep-unit` puts its container under the cgroup it was started in.  Started
from one shell, every container got the same one, so their systemds shared one tree:
t1's sglang.service was t2's and t3's too (seen: a stop on t1 reading the others' processes,
"Failed to kill control group ...: Input/output error", and a start on t1 failing with
219/CGROUP when t2's systemd removed the shared directory under it).  Real boxes each have
their own systemd and their own tree; so does each sandbox host, from `argv`.

Only the hierarchies systemd tracks processes by are split: the cgroup2 one (unified or
hybrid) and the v1 `name=systemd` one; v1 controllers (memory, pids) stay shared.
"""
from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Callable

TOP = "specops-sandbox"  # every host's subtree lives under this one, in each hierarchy


def _hierarchies(mountinfo: str) -> list[Path]:
    """The mount points of the hierarchies systemd tracks processes by.

    >>> mi = ('40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\\n'
    ...       '41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\\n'
    ...       '35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\\n')
    >>> [str(p) for p in _hierarchies(mi)]
    ['/sys/fs/cgroup/systemd', '/sys/fs/cgroup/unified']
    """
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        sep = fields.index("-")
        point, fstype, options = fields[4], fields[sep + 1], fields[sep + 3]
        if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options.split(",")):
            found.append(Path(point.replace("\\040", " ")))
    return found


def tops() -> list[Path]:
    # At the top of each hierarchy, not under the caller's cgroup: run through sudo from a
    # desktop session, that one is the user's, and so would the containers' be.
    return [h / TOP for h in _hierarchies(Path("/proc/self/mountinfo").read_text())]


def argv(name: str, command: list[str]) -> list[str]:
    """`command` run from a cgroup of the host's own (`name`: unique on this machine), in every
    tracked hierarchy: a shell moves itself there, then execs it (its pid stays the command's)."""
    found = tops()
    if not found:
        raise RuntimeError("no cgroup2 or name=systemd hierarchy is mounted: sandbox hosts need one")
    moves = []
    for top in found:
        group = top / name
        try:
            group.mkdir(parents=True, exist_ok=True)
            owners = {top.stat().st_uid, group.stat().st_uid}
        except OSError as e:
            raise RuntimeError(f"cannot make the host's cgroup {group}: {e}") from None
        if owners != {0}:
            raise RuntimeError(f"{group} is not root's: refusing to boot a host in it")
        moves.append(f"echo $$ > {shlex.quote(str(group / 'cgroup.procs'))}")
    return ["sh", "-c", " && ".join(moves + ['exec "$@"']), "sh", *command]


def remove(match: Callable[[str], bool]) -> None:
    """Remove every host subtree whose name `match`es (its containers are stopped).
    Only directories are removed, deepest first; one still holding a process stays."""
    deadline = time.monotonic() + 5  # a container just killed takes a moment to leave its group
    while True:
        groups = [g for top in tops() if top.is_dir() for g in top.iterdir() if g.is_dir() and match(g.name)]
        for group in groups:
            for path, _, _ in os.walk(group, topdown=False):
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        if not any(g.exists() for g in groups) or time.monotonic() > deadline:
            return
        time.sleep(0.2)
