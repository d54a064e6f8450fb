"""Debian/Ubuntu packages a GPU box needs before anything else (bootstrap only): always Python
with venv and CA certificates; rsync (with its rrsync) on a box that copies weights from a peer,
or is the peer another box copies from."""
from specops.ops.apt import AptPackages

from specops.kinds.sglang import weight_peers

NAME = "system_packages"
VARS = {}  # the host vars it reads
AFTER = ("gpu_fit",)  # the roles it runs after, when they run (a box its GPUs refuse gets no package)
# Installed before the next role plans: the models role's peer copy runs rsync while it plans.
REPROBE = True
PACKAGES = ["python3", "python3-venv", "ca-certificates"]
PEER_COPY = ["rsync", "openssh-client"]  # rsync runs over ssh (the peer has it: it runs sshd)


def packages(host) -> list[str]:
    others = (host.inventory.hosts if host.inventory else {}).values()
    copies = weight_peers(host) or any(host.name in weight_peers(h) for h in others if h.name != host.name)
    return PACKAGES + (PEER_COPY if copies else [])


def ops(host):
    return [AptPackages(packages(host))]
