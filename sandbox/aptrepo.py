"""A local apt repository on a sandbox host, so that bootstrap's apt-get works with no mirror.

A sandbox host reaches nothing outside (and must not), but its image keeps the .debs debootstrap
fetched (/var/cache/apt/archives).  `serve` indexes the packages asked for into a flat repository on
the host and makes it the host's only apt source; with `remove`, they are first taken off the host, which is
then what a rented box without them is.
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from sandbox.fleet import Host

REPO = "/srv/specops-apt"
ARCHIVES = "/var/cache/apt/archives"


DEBS = Path("/var/cache/specops/debs")  # .debs setup.sh downloaded on the controller (apt-get download)


def controller_deb(name: str) -> Path:
    """A .deb the controller keeps for the sandbox hosts (scripts/setup.sh downloads it)."""
    found = sorted(DEBS.glob(f"{name}_*.deb"))
    if not found:
        raise RuntimeError(f"no {name} .deb in {DEBS}: run scripts/setup.sh")
    return found[-1]


def serve(h: Host, packages: list[str], remove: bool = True, debs: tuple = ()) -> None:
    """`packages` from the host's own archives, and `debs` (paths on the controller) beside them."""
    h.run("mkdir", "-p", REPO)
    entries = []
    for deb in [*(next(iter(h.path(ARCHIVES).glob(f"{name}_*.deb"))) for name in packages), *debs]:
        data = deb.read_bytes()
        h.path(f"{REPO}/{deb.name}").write_bytes(data)
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
        entries.append(control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    h.path(f"{REPO}/Packages").write_text("\n".join(entries))
    h.path("/etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{REPO} ./\n")
    h.run("find", "/etc/apt/sources.list.d", "-type", "f", "-delete", check=False)
    if remove:
        h.run("dpkg", "--purge", *packages)
