"""The system user a service with `user:` runs as: made by specops when missing (a system account
whose comment marks it as specops's, with a nologin shell and a locked password), in the groups
that own the host's GPU device nodes.  A group is read from the nodes at every run, so a driver
reinstalled with another NVreg_DeviceFileGID is followed; a group it was given is never taken
away.  Its home is the unit's StateDirectory (kinds/hardening.py), never a directory useradd makes.

Refused, before the unit changes, naming why: an account of that name that specops did not make
(without the comment, or with a uid in the login range, a login shell or a password that is not
locked: a person's login, a daemon's account; the server would run with its groups and its
files, and it could read the server's environment), uid 0, and a GPU node that neither its group
(other than root) nor everyone may read and write (the server would die in CUDA's "No CUDA GPUs
are available").  Two services of a host never share a user: each could read the other's secrets.
"""
from __future__ import annotations

import shlex

from ..errors import UsageError
from . import handlers
from .systemd import Command

MARK = "specops service user"  # the account's comment (GECOS): specops made it
# The nodes a CUDA process opens.  MIG's capability nodes (/dev/nvidia-caps) are made on demand,
# root's alone; a MIG user sets them up as the driver's documentation says.
GPU_NODES = "/dev/nvidiactl /dev/nvidia-uvm /dev/nvidia[0-9]*"

# Sets $groups to the comma-separated groups the user needs, or exits 3 naming a node it could
# not open.  $u is the user.  (stat -L: only root makes entries in /dev.)
_GROUPS = """groups=
for d in %s; do
  [ -e "$d" ] || continue
  a=$(stat -Lc %%A "$d")
  case "$a" in ???????rw?) continue ;; esac
  g=$(stat -Lc %%G "$d")
  case "$a" in ????rw????) [ "$g" != root ] && groups="${groups:+$groups,}$g" && continue ;; esac
  echo "$d is $(stat -Lc '%%U:%%G %%a' "$d"): user $u could not open it;" \
    "give the GPU nodes a group that may read and write them (NVreg_DeviceFileGID, NVreg_DeviceFileMode)" >&2
  exit 3
done
""" % GPU_NODES

# Whether the account is specops's: exits 0 when it is, 1 when missing, 3 (saying why) otherwise.
# The comment alone is not proof: where chfn lets users change theirs, a login user could write
# the mark.  What useradd --system gave it and its owner cannot change is: a uid below the login
# range, a nologin shell (chsh offers only /etc/shells), a locked password (passwd cannot lock).
# printf, not echo: dash's echo reads backslashes, and a comment of \n and \072 forged the shell.
_OURS = """entry=$(getent passwd "$u") || exit 1
uid=$(printf '%%s\\n' "$entry" | cut -d: -f3); shell=$(printf '%%s\\n' "$entry" | cut -d: -f7)
min=$(awk '$1 == "UID_MIN" {print $2}' /etc/login.defs 2>/dev/null)
why=
[ "$(printf '%%s\\n' "$entry" | cut -d: -f5)" = %s ] || why="its comment is not '%s'"
[ "$uid" != 0 ] && [ "$uid" -lt "${min:-1000}" ] || why="${why:-uid $uid is not a system account's}"
case "$shell" in */nologin|*/false) ;; *) why="${why:-its shell $shell is a login shell}" ;; esac
case "$(getent shadow "$u" | cut -d: -f2)" in '!'*|'*'*) ;; *) why="${why:-its password is not locked}" ;; esac
if [ -n "$why" ]; then
  echo "user $u exists and is not one specops made ($why): give the service a user name of its own" >&2
  exit 3
fi
""" % (shlex.quote(MARK), MARK)

_IS_SET = """(""" + _OURS + """) || exit $?
for g in $(echo "$groups" | tr , ' '); do id -nG "$u" | tr ' ' '\\n' | grep -qx "$g" || exit 1; done
"""

_MAKE = """set +e; (""" + _OURS + """); ours=$?; set -e
[ "$ours" = 3 ] && exit 3
[ "$ours" = 1 ] && useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \\
  --comment %s "$u"
[ -z "$groups" ] || usermod -a -G "$groups" "$u"
""" % shlex.quote(MARK)


def system_user(name: str, notify=()) -> Command:
    """The op that makes `name` a service user (the schema allows only a plain user name)."""
    head = "set -e\nu=%s\n" % shlex.quote(name) + _GROUPS
    # The check runs without -e: its own exit says whether the user is as wanted.
    return Command(["/bin/sh", "-c", head + _MAKE], desc=f"user {name} (GPU device groups)",
                   unless=head.replace("set -e\n", "") + _IS_SET, notify=notify)


def service_users(host, services: list[dict]) -> list[Command]:
    """The ops for the users of these services (of the host's): a change of its groups restarts
    its services (a process takes its groups when it starts)."""
    owners: dict[str, str] = {}
    for svc in host.get("services") or []:
        if svc.get("user") and owners.setdefault(svc["user"], svc["name"]) != svc["name"]:
            raise UsageError(f"{host.name}: services {owners[svc['user']]!r} and {svc['name']!r} both run as user "
                             f"{svc['user']!r}: give each its own (each could read the other's secrets)")
    users = sorted({s["user"] for s in services if s.get("user")})
    return [system_user(u, notify=[handlers.restart(s["name"]) for s in services if s.get("user") == u])
            for u in users]
