"""A unit's facts kept from its last `systemctl show`, reused while nothing that moves what
systemd answers has moved: a no-op's probe then spawns no systemctl and makes PID 1 answer nothing
(~5 ms of a host's CPU a unit: 3.4 systemctl's own, 1.7 PID 1's, on a bench host).

A kept fact is reused only while all of these hold, each read from /proc, /run or an inode:
- the same boot (/proc/sys/kernel/random/boot_id);
- the same run of the unit: /run/systemd/units/invocation:NAME, which systemd writes when a run
  starts and removes when it ends, names the kept InvocationID, and a service's kept MainPID is
  alive with its kept start time;
- it was active with no job queued when kept, and a service's main process was running;
- systemd has not reloaded: it makes its generators' directories anew on every daemon-reload
  (/run/systemd/generator*; a host without them keeps nothing);
- its unit file, its drop-ins and what enables or masks it are as they were: device, inode,
  size, mtime and ctime of FragmentPath, of each of DropInPaths, of every entry of the
  directories where `systemctl edit`, `enable`, `mask` and `set-property` write (a link added
  to a .wants directory moves that directory's times), and of the places a package or a
  transient unit of that name would put one.
So a change on disk is seen at once, and what PID 1 loaded late (an edit or `disable
--no-reload` followed later by a reload) at the reload.  The witness is taken just after systemd
answered, and the fact is kept only if none of those times is later than a clock tick before it
was asked (settled()).  The start timestamps are kept as systemd's monotonic clock gives them.
A stop in progress (`deactivating`, its main process still there) reads as the run it ends until
that process is gone: a probe's answer is a snapshot anyway, which a stop may follow at once.
"""
import os
import time

from specops.agent.lean import dumps, loads
from specops.layout import UNIT_DIR, UNIT_FACTS

TICK, COARSE = 0.05, 2.0  # seconds: above a kernel's coarse clock tick; a filesystem of whole seconds
BOOT_ID = "/proc/sys/kernel/random/boot_id"
INVOCATION = "/run/systemd/units/invocation:"
WRITTEN = (UNIT_DIR, "/run/systemd/system", UNIT_DIR + ".control", "/run/systemd/system.control")  # every entry
RELOADED = ("/run/systemd/generator", "/run/systemd/generator.early", "/run/systemd/generator.late")
VENDOR = "/usr/lib/systemd/system"  # a package's units and drop-ins
# A transient unit's own file (not the directory: every SSH login's session scope is written there)
TRANSIENT, ATTACHED = "/run/systemd/transient", "/run/systemd/system.attached"


def _read(path):
    """A file of root's (or this user's) with one name only, never through a link; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or st.st_nlink != 1:
            return None
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
    kind = unit.rsplit(".", 1)[1]
    parts += [_ident(p, newest) for p in paths if p]
    elsewhere = (VENDOR, "%s/%s.d" % (VENDOR, unit), "%s/%s.d" % (VENDOR, kind), "%s/%s" % (TRANSIENT, unit),
                 "%s/%s.d" % (TRANSIENT, unit), ATTACHED)
    parts += [_ident(p, newest) for p in RELOADED + elsewhere]
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
    pid = fact.get("MainPID", "0")
    if not pid.isdigit() or pid == "0" or starttime(int(pid)) != entry.get("main_started"):
        return None
    if witness(name, paths(fact))[0] != entry.get("witness"):
        return None
    return dict(fact)


def keepable(name, fact, seen, asked):
    """Whether a fact systemd gave of unit `name` when `asked` (a time.time()), with the witness
    `seen` (witness(): taken after), may be kept: a service's while it runs its main process
    (a timer's never: systemd links no invocation of a timer); nothing in the witness written
    after a tick before it was asked."""
    witnessed, newest = seen
    lines = witnessed.split("\n")
    same_run = "run %s" % fact.get("InvocationID") in lines
    reloads_seen = any(line.split(" ")[0] in RELOADED and not line.endswith(" -") for line in lines)
    if fact.get("ActiveState") != "active" or fact.get("Job", "") not in ("", "0") or not same_run \
            or not reloads_seen or not settled(newest, asked):
        return False
    return fact.get("SubState") == "running" and fact.get("MainPID", "0") not in ("", "0")


def keep(name, kept, fact, asked, starttime):
    """Keep (in UNIT_FACTS) a fact systemd just gave, if it may be reused; forget an older one."""
    seen = witness(name, paths(fact))
    started = starttime(int(fact.get("MainPID") or 0))
    entry = dict(fact=fact, witness=seen[0], main_started=started) \
        if keepable(name, fact, seen, asked) and started is not None else None
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
