"""Debian/Ubuntu packages a GPU box needs before anything else (bootstrap only)."""
from specops import protocol
from specops.ops import Op

NAME = "system_packages"
PACKAGES = ["python3", "python3-venv", "ca-certificates"]


class AptPackages(Op):
    def __init__(self, names):
        self.names = names

    def wants(self):
        return protocol.Probe(checks={f"dpkg:{n}": f"dpkg-query -W -f='${{Status}}' {n} 2>/dev/null | "
                                                   f"grep -q 'install ok installed'" for n in self.names})

    def plan(self, facts, ctx):
        missing = [n for n in self.names if facts.check(f"dpkg:{n}") != 0]
        if not missing:
            return self._change("apt packages", "ok")
        cmd = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq " + " ".join(missing)
        return self._change("apt packages", f"install {' '.join(missing)}",
                            [protocol.Run(cmd=cmd, desc=f"apt-get install {' '.join(missing)}")])


def ops(host):
    return [AptPackages(PACKAGES)]
