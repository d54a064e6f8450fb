"""Debian/Ubuntu packages a GPU box needs before anything else (bootstrap only): always Python
with venv and CA certificates; rsync (with its rrsync) on a box that copies weights from a peer,
or is the peer another box copies from."""
from specops.inventory import schema
from specops import protocol
from specops.ops import Op

from specops.services.sglang import weight_peers

NAME = "system_packages"
VARS = {}  # the host vars it reads
AFTER = ()  # the roles it runs after, when they run
# Installed before the next role plans: the models role's peer copy runs rsync while it plans.
REPROBE = True
PACKAGES = ["python3", "python3-venv", "ca-certificates"]
PEER_COPY = ["rsync", "openssh-client"]  # rsync runs over ssh (the peer has it: it runs sshd)


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


def packages(host) -> list[str]:
    others = (host.inventory.hosts if host.inventory else {}).values()
    copies = weight_peers(host) or any(host.name in weight_peers(h) for h in others if h.name != host.name)
    return PACKAGES + (PEER_COPY if copies else [])


def ops(host):
    return [AptPackages(packages(host))]
