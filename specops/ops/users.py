"""The system user a service with `user:` runs as: made when missing, in the groups that own the
host's GPU device nodes (a group is read from the nodes at every run, so a driver reinstalled with
another NVreg_DeviceFileGID is followed).  Its home is the unit's StateDirectory
(services/__init__.py), never a directory useradd makes.

A node its user could not open (group root, not world-writable) fails the run before the unit
changes, naming the node: the server would otherwise die in CUDA's "No CUDA GPUs are available".
"""
from __future__ import annotations

import shlex

from . import handlers
from .systemd import Command

# The nodes a CUDA process opens (the MIG capability nodes are root's alone and not needed).
GPU_NODES = "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia[0-9]*"

# Sets $groups to the comma-separated groups the user needs, or exits 3 naming a node no group
# opens.  $u is the user.
_GROUPS = """groups=
for d in %s; do
  [ -e "$d" ] || continue
  case "$(stat -c %%a "$d")" in *6) continue ;; esac
  g=$(stat -c %%G "$d")
  if [ "$g" = root ]; then
    echo "$d is $(stat -c '%%U:%%G %%a' "$d"): user $u cannot open it; give the GPU nodes a group (NVreg_DeviceFileGID)" >&2
    exit 3
  fi
  groups="${groups:+$groups,}$g"
done
""" % GPU_NODES

_IS_SET = """id -u "$u" >/dev/null 2>&1 && [ "$(id -u "$u")" != 0 ] || exit 1
for g in $(echo "$groups" | tr , ' '); do id -nG "$u" | tr ' ' '\\n' | grep -qx "$g" || exit 1; done
"""

_MAKE = """if ! id -u "$u" >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$u"
fi
if [ "$(id -u "$u")" = 0 ]; then echo "user $u has uid 0: not a service user" >&2; exit 3; fi
[ -z "$groups" ] || usermod -a -G "$groups" "$u"
"""


def system_user(name: str, notify=()) -> Command:
    """The op that makes `name` a service user (the schema allows only a plain user name)."""
    head = "set -e\nu=%s\n" % shlex.quote(name) + _GROUPS
    # The check runs without -e: its own exit says whether the user is as wanted.
    return Command(["/bin/sh", "-c", head + _MAKE], desc=f"user {name} (GPU device groups)",
                   unless=head.replace("set -e\n", "") + _IS_SET, notify=notify)


def service_users(services: list[dict]) -> list[Command]:
    """The ops for the users of these services; a change of its groups restarts its services (a
    process takes its groups when it starts)."""
    users = sorted({s["user"] for s in services if s.get("user")})
    return [system_user(u, notify=[handlers.restart(s["name"]) for s in services if s.get("user") == u])
            for u in users]
