"""Each sandbox host's own cgroup subtree.

`systemd-nspawn --keep-unit` puts its container under the cgroup it was started in.  Started
from one shell, every container got the same one, so their systemds shared one tree:
t1's sglang.service was t2's and t3's too (seen: a stop on t1 reading the others' processes,
"Failed to kill control group ...: Input/output error", and a start on t1 failing with
219/CGROUP when t2's systemd removed the shared directory under it).  Real boxes each have
their own systemd and their own tree; so does each sandbox host, from `argv`.

Only the hierarchies systemd tracks processes by are split: the cgroup2 one (unified or
hybrid) and the v1 `name=systemd` one.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Callable

TOP = "specops-sandbox"  # every host's subtree lives under this one, in each hierarchy


def _hierarchies(mountinfo: str, cgroup: str) -> list[Path]:
    """Where this process's cgroup is in each tracked hierarchy, as a directory.

    >>> mi = ('40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\\n'
    ...       '41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\\n'
    ...       '35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\\n')
    >>> [str(p) for p in _hierarchies(mi, '9:name=systemd:/\\n4:memory:/x\\n0::/a.scope\\n')]
    ['/sys/fs/cgroup/systemd', '/sys/fs/cgroup/unified/a.scope']
    """
    mine = {}
    for line in cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in ("", "name=systemd"):
            mine["cgroup2" if controllers == "" else "name=systemd"] = path
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        sep = fields.index("-")
        root, point, fstype, options = fields[3], fields[4], fields[sep + 1], fields[sep + 3]
        kind = "cgroup2" if fstype == "cgroup2" else \
            "name=systemd" if fstype == "cgroup" and "name=systemd" in options.split(",") else None
        if kind in mine and mine[kind].startswith(root):
            found.append(Path(point + "/" + mine.pop(kind)[len(root):].strip("/")).resolve())
    return found


def _tops() -> list[Path]:
    return [h / TOP for h in _hierarchies(Path("/proc/self/mountinfo").read_text(),
                                           Path("/proc/self/cgroup").read_text())]


def argv(name: str, command: list[str]) -> list[str]:
    """`command` run from a cgroup of the host's own (`name`: unique on this machine), in every
    tracked hierarchy: a shell moves itself there, then execs it (its pid stays the command's)."""
    moves = []
    for top in _tops():
        group = top / name
        group.mkdir(parents=True, exist_ok=True)
        moves.append(f"echo $$ > {shlex.quote(str(group / 'cgroup.procs'))}")
    return ["sh", "-c", " && ".join(moves + ['exec "$@"']), "sh", *command]


def remove(match: Callable[[str], bool]) -> None:
    """Remove every host subtree whose name `match`es (its containers are stopped).
    Only directories are removed, deepest first; one still holding a process stays."""
    for top in _tops():
        if not top.is_dir():
            continue
        for group in top.iterdir():
            if group.is_dir() and match(group.name):
                for path, dirs, _ in os.walk(group, topdown=False):
                    try:
                        os.rmdir(path)
                    except OSError:
                        pass
