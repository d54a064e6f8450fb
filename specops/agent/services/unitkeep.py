"""A unit's facts kept from its last `systemctl show`, reused while nothing systemd would answer
differently can have changed: a no-op's probe then spawns no systemctl and makes PID 1 answer
nothing (~5 ms of a host's CPU a unit: 3.4 systemctl's own, 1.7 PID 1's, on a bench host).

A kept fact is reused only while all of these hold, each read from /proc, /run or an inode:
- the same boot (/proc/sys/kernel/random/boot_id);
- the same run of the unit: /run/systemd/units/invocation:NAME, which systemd writes when a run
  starts and removes when it ends, names the kept InvocationID, and the kept MainPID is alive
  with its kept start time;
- it was active when kept, and a service's main process was running;
- its unit file, its drop-ins and what enables or masks it are as they were: device, inode,
  size, mtime and ctime of FragmentPath, of each of DropInPaths, and of every entry of the
  directories where `systemctl edit`, `enable`, `mask` and `set-property` write (a link added
  to a .wants directory moves that directory's times).
The witness is taken just after systemd answered, and the fact is kept only if none of those
times is later than a clock tick before it was asked (settled()): a change made while it was
asked, or a second write in the same tick as the last one, would not show in them.
A job queued for the unit and not started yet is not seen: a probe's answer is a snapshot
anyway, which a `systemctl stop` may follow at once.
"""
import os
import time

from specops.agent.lean import dumps, loads
from specops.layout import UNIT_DIR, UNIT_FACTS

TICK, COARSE = 0.05, 2.0  # seconds: above a kernel's coarse clock tick; a filesystem of whole seconds
BOOT_ID = "/proc/sys/kernel/random/boot_id"
INVOCATION = "/run/systemd/units/invocation:"
WRITTEN = (UNIT_DIR, "/run/systemd/system", UNIT_DIR + ".control",
           "/run/systemd/system.control", "/run/systemd/transient")


def _read(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(1 << 20).decode("utf-8", "replace")


def _ident(path, newest):
    try:
        st = os.lstat(path)
    except OSError:
        return "%s -" % path
    newest[0] = max(newest[0], st.st_ctime_ns, st.st_mtime_ns)
    return "%s %d %d %d %d %d" % (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def witness(name, paths):
    """What must be as it was for a kept fact of unit `name` to hold (one string), and the newest
    time in it; `paths`: its FragmentPath and DropInPaths as systemd last named them."""
    newest = [0.0]
    unit = name if "." in name else name + ".service"  # as systemctl takes it; systemd's link has the suffix
    parts = [_read(BOOT_ID) or "", "run %s" % _link(INVOCATION + unit)]
    parts += [_ident(p, newest) for p in paths if p]
    for d in WRITTEN:
        parts.append(_ident(d, newest))
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        parts += [_ident(os.path.join(d, n), newest) for n in names]
    return "\n".join(parts), newest[0]


def _link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def paths(fact):
    return [fact.get("FragmentPath")] + (fact.get("DropInPaths") or "").split()


def load():
    try:
        kept = loads(_read(UNIT_FACTS) or "{}")
    except ValueError:
        return {}
    return kept if isinstance(kept, dict) else {}


def reuse(name, kept, starttime):
    """The kept fact of unit `name` if it still holds, else None."""
    entry = kept.get(name)
    if not isinstance(entry, dict) or not isinstance(entry.get("fact"), dict):
        return None
    fact = entry["fact"]
    if not name.endswith(".timer"):
        pid = fact.get("MainPID", "0")
        if not pid.isdigit() or pid == "0" or starttime(int(pid)) != entry.get("main_started"):
            return None
    if witness(name, paths(fact))[0] != entry.get("witness"):
        return None
    return dict(fact)


def keepable(name, fact, seen, asked):
    """Whether a fact systemd gave of unit `name` when `asked` (a time.time()), with the witness
    `seen` (witness(): taken after), may be kept: a service's while it runs its main process, a
    timer's while it is active; nothing in the witness written after a tick before it was asked."""
    witnessed, newest = seen
    same_run = "run %s" % fact.get("InvocationID") in witnessed.split("\n")
    if fact.get("ActiveState") != "active" or not same_run or not settled(newest, asked):
        return False
    if name.endswith(".timer"):  # no process of its own: its run is its invocation
        return True
    return fact.get("SubState") == "running" and fact.get("MainPID", "0") not in ("", "0")


def keep(name, kept, fact, asked, starttime):
    """Keep (in UNIT_FACTS) a fact systemd just gave, if it may be reused; forget an older one."""
    seen = witness(name, paths(fact))
    entry = dict(fact=fact, witness=seen[0], main_started=starttime(int(fact.get("MainPID") or 0))) \
        if keepable(name, fact, seen, asked) else None
    if kept.get(name) != entry:
        kept[name] = entry
        save(kept)


def settled(newest_ns, asked):
    """Whether a file last written at `newest_ns` was written a tick of the kernel's coarse clock
    before `asked` (two seconds on a filesystem that keeps whole seconds): a later write, even in
    that tick, shows in its times."""
    grain = COARSE if newest_ns % 1000000000 == 0 else TICK
    return newest_ns / 1e9 < asked - grain


def save(kept):
    """Write the kept facts (root's own directory, a temporary file renamed over the last)."""
    tmp = "%s.%d.tmp" % (UNIT_FACTS, os.getpid())
    try:
        os.makedirs(os.path.dirname(UNIT_FACTS), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(dumps(kept, sort_keys=True))
        os.rename(tmp, UNIT_FACTS)
    except OSError:
        pass  # a cache: the next probe asks systemd
