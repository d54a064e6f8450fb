"""Debian/Ubuntu packages, by name: installed with apt-get when dpkg does not list them."""
from .. import protocol
from .base import Op


class AptPackages(Op):
    """Packages that must be installed (never removed); Recommends are not pulled in."""

    def __init__(self, names):
        self.names = names

    def wants(self):
        return protocol.Probe(checks={f"dpkg:{n}": f"dpkg-query -W -f='${{Status}}' {n} 2>/dev/null | "
                                                   f"grep -q 'install ok installed'" for n in self.names})

    def plan(self, facts, ctx):
        missing = [n for n in self.names if facts.check(f"dpkg:{n}") != 0]
        if not missing:
            return self._change("apt packages", "ok")
        # no pty for dpkg: its progress is not redrawn as a line per percent in the run's output
        cmd = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
               "-o Dpkg::Use-Pty=0 " + " ".join(missing))
        return self._change("apt packages", f"install {' '.join(missing)}",
                            [protocol.Run(cmd=cmd, desc=f"apt-get install {' '.join(missing)}")])
