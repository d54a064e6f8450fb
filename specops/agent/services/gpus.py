"""GPUs, as nvidia-smi reports them, with each compute app attributed to the unit whose run it
belongs to (procs).  Memory nvidia-smi cannot report ([N/A], [Not Supported]) is None."""
import os

from specops.agent.services import procs
from specops.agent.host import clean, read_state, update_state
from specops.agent.lean import status_output

BOOT_ID = "/proc/sys/kernel/random/boot_id"
DRIVER = "/proc/driver/nvidia/version"
RUNS_KEPT = 8
_ASKED = []  # set when this agent asked nvidia-smi for a plan: the runs it starts then hold those GPUs
NOT_REPORTED = ("[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[Insufficient Permissions]")


def which(name):
    """shutil.which without importing shutil (and the archive modules it pulls in)."""
    for d in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _mib(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def gpu_fact(unit_names=(), apps=True, seen=None):
    """nvidia-smi's GPUs and (with `apps`) compute apps; memory nvidia-smi cannot report is None
    (and named in `unknown`); each app is attributed to one of `unit_names` when it belongs to one
    of its runs (`seen`: the probe's facts of those units, which systemd is not asked again).
    Without `apps`, one nvidia-smi call instead of two, and no systemd calls."""
    smi = which("nvidia-smi")
    if not smi:
        return {"present": False}

    def query(kind, fields):
        status, out, err = status_output([smi, "--query-%s=%s" % (kind, ",".join(fields)),
                                          "--format=csv,noheader,nounits"])
        if status != 0:
            raise RuntimeError(err.strip() or out.strip() or "exit status %d" % status)
        return [dict(zip(fields, [c.strip() for c in line.split(",")]))
                for line in out.strip().splitlines() if line.strip()]

    try:
        gpus = query("gpu", ["index", "uuid", "name", "driver_version", "memory.total", "memory.used"])
        listed = query("compute-apps", ["pid", "gpu_uuid", "used_memory"]) if apps else None
    except Exception as e:
        return {"present": True, "error": clean(str(e))[-300:]}
    unknown = []
    for g in gpus:
        for k in ("memory.total", "memory.used"):
            if g[k] in NOT_REPORTED or _mib(g[k]) is None:
                unknown.append("GPU %s %s (%s)" % (g["index"], k, g[k]))
            g[k] = _mib(g[k])
    fact = {"present": True, "gpus": gpus, "unknown": unknown, "driver": gpus[0]["driver_version"] if gpus else None}
    if listed is not None:
        fact["apps"] = _apps(listed, gpus, unit_names, unknown, seen)
    return fact


def _apps(apps, gpus, unit_names, unknown, seen):
    """Each compute app as a Process, attributed to its unit's run where it has one."""
    index = {g["uuid"]: g["index"] for g in gpus}
    runs = {}
    owners = procs.attribute([int(a["pid"]) for a in apps if a["pid"].isdigit()], unit_names, runs, seen)
    out = []
    for a in apps:
        if not a["pid"].isdigit():
            continue
        pid = int(a["pid"])
        if a["used_memory"] in NOT_REPORTED:
            unknown.append("pid %d used_memory (%s)" % (pid, a["used_memory"]))
        p = procs.describe(pid, _mib(a["used_memory"]), owners.get(pid))
        gpu = index.get(a["gpu_uuid"])
        p["gpu"] = int(gpu) if gpu is not None and str(gpu).isdigit() else None
        p["earlier"] = runs.get(pid) == "earlier"  # a leftover of a run that is over
        out.append(p)
    return out


def for_plan(units, seen, record):
    """The GPUs for a plan (no compute apps): nvidia-smi's answer, kept in the state file with the
    runs of `units` (SGLang's: the runs that hold the GPUs) active when it was asked, and given
    again while one of those runs is still the one running, in the same boot and under the same
    driver (/proc/driver/nvidia/version where there is one): a loaded driver cannot be replaced,
    nor a GPU taken out of the machine, while a process holds it.  `seen`: the probe's unit facts.
    What moves (memory used) is as it was then; a plan reads only the GPUs, their memory and the
    driver.  Only a probe that holds the host lock (`record`) writes the state file.  Real
    nvidia-smi takes 0.1 s and more of a host's CPU: a no-op deploy asks nothing."""
    boot = _boot_id()
    running = {seen[u].get("InvocationID") for u in units if u in seen
               and seen[u].get("ActiveState") == "active" and seen[u].get("InvocationID")}
    kept = read_state().get("gpus") or {}
    if boot and kept.get("boot") == boot and running & set(kept.get("runs") or ()):
        return dict(kept["fact"], kept=True)
    fact = gpu_fact(units, apps=False)
    if record and boot and fact.get("present") and not fact.get("error"):
        entry = {"boot": boot, "fact": fact, "runs": sorted(running), "units": sorted(units)}
        update_state(lambda state: state.__setitem__("gpus", entry))
        _ASKED.append(True)
    return fact


def started(unit, invocation):
    """A run of one of the units the answer was kept for, which this agent started after asking
    nvidia-smi for its plan (a deploy's restart), holds the GPUs that answer describes."""
    if not _ASKED or not invocation:
        return

    def add(state):
        kept = state.get("gpus")
        if kept and unit in kept.get("units", ()) and invocation not in kept["runs"]:
            kept["runs"] = (kept["runs"] + [invocation])[-RUNS_KEPT:]
    update_state(add)


def _boot_id():
    """This boot, and the driver loaded in it where the host has one: a reload is another."""
    parts = []
    for path in (BOOT_ID, DRIVER):
        try:
            with open(path) as f:
                parts.append(f.read().strip())
        except OSError:
            if path == BOOT_ID:
                return None
    return "\n".join(parts)
