"""Debian/Ubuntu packages, by name: installed with apt-get when dpkg does not list them."""
import re

from .. import protocol
from .base import Op

NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")  # Debian policy's package names: nothing a shell reads

INSTALLED, CANDIDATE, NO_CANDIDATE = 0, 1, 2  # the probe's answer per package (its shell's exit status)


def _probe(name: str) -> str:
    """One shell: installed (0); else whether the host's own package lists have a candidate (1) or
    not (2).  apt-cache reads only the lists on disk: it fetches nothing."""
    return (f"dpkg-query -W -f='${{Status}}' {name} 2>/dev/null | grep -q 'install ok installed' && exit {INSTALLED}; "
            f"apt-cache policy {name} 2>/dev/null | grep -q '^ *Candidate: [^(]' && exit {CANDIDATE}; exit {NO_CANDIDATE}")


class AptPackages(Op):
    """Packages that must be installed (never removed); Recommends are not pulled in.  An install
    prepares: it runs before anything that serves changes, and is not undone."""

    def __init__(self, names):
        bad = [n for n in names if not NAME.match(n)]
        if bad:
            raise ValueError(f"not a Debian package name: {bad[0]!r}")
        self.names = names

    def wants(self):
        return protocol.Probe(checks={f"dpkg:{n}": _probe(n) for n in self.names})

    def plan(self, facts, ctx):
        missing = [n for n in self.names if facts.check(f"dpkg:{n}") != INSTALLED]
        if not missing:
            return self._change("apt packages", "ok")
        unknown = [n for n in missing if facts.check(f"dpkg:{n}") == NO_CANDIDATE]
        change = self._change("apt packages", f"install {' '.join(missing)}",
                              [protocol.AptInstall(packages=missing, desc=f"apt-get install {' '.join(missing)}")])
        if unknown:  # not refused: a deploy refreshes the lists first (apt-get update), which may find them
            change.fails = (f"{', '.join(unknown)}: no candidate in the host's package lists (apt-cache policy); "
                            f"unless apt-get update finds {'them' if unknown[1:] else 'it'}, a deploy fails "
                            f"before anything that serves changes")
        return change
