"""Facts about the host, gathered in one pass for a plan: files and units here; venvs (venvs)
and GPUs (gpus) from their own modules."""
import binascii
import os
import stat
import sys
import time

from specops import protocol
from specops.agent import lock, safefs
from specops.agent.services import gpus, procs, unitkeep
from specops.agent.services.gpus import gpu_fact
from specops.agent.host import group_name, sha256, user_name, wall_time
from specops.agent.converge import upstream
from specops.agent.converge.venvs import resolve_key, venv_fact
from specops.agent.lean import output
from specops.layout import APPLY_JOURNAL, LOCK_DIR, PYCACHE, is_bytecode_of

CONTENT_LIMIT = 2 * 1024 * 1024
UNIT_PROPS = ("LoadState", "ActiveState", "SubState", "ActiveEnterTimestampMonotonic",
              "ExecMainStartTimestampMonotonic", "ExecMainPID", "MainPID", "NRestarts",
              "ControlGroup", "FragmentPath", "DropInPaths", "UnitFileState", "Result", "InvocationID", "User", "Job")


def file_fact(path, want_content=None, allowed=()):
    """What is at `path`, read without following a link anyone but root planted: type, size,
    mtime, mode, owner, sha256, the content when the controller's sha256 differs, for a .py its
    cached bytecode; `unsafe` when the path cannot be read safely, `unsafe_write` when specops
    could not write there (its directory is writable by another user)."""
    parent, name = os.path.split(path)
    try:
        dfd, _ = safefs.open_dir(parent, allowed, for_writing=False)
    except safefs.Missing:
        return {"path": path, "exists": False}
    except safefs.UnsafePath as e:
        return {"path": path, "exists": True, "type": "unsafe", "unsafe": str(e)}
    try:
        return _fact_in(dfd, path, name, want_content, allowed)
    finally:
        os.close(dfd)


def _fact_in(dfd, path, name, want_content, allowed):
    st = safefs.lstat_in(dfd, name)
    if st is None:
        fact = {"path": path, "exists": False}
    else:
        fact = {"path": path, "exists": True, "mtime": st.st_mtime, "size": st.st_size,
                "mode": "%04o" % stat.S_IMODE(st.st_mode),
                "owner": user_name(st.st_uid), "group": group_name(st.st_gid),
                "type": "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode)
                else "file" if stat.S_ISREG(st.st_mode) else "other"}
    try:
        safefs.close(safefs.open_dir(os.path.dirname(path), allowed))
    except safefs.UnsafePath as e:
        fact["unsafe_write"] = str(e)
    # where a write would be staged (beside the file): whether it can be, and the room there
    fs = os.fstatvfs(dfd)
    fact.update(dir_read_only=bool(fs.f_flag & os.ST_RDONLY), dir_free=fs.f_bavail * fs.f_frsize,
                dir_device=os.fstat(dfd).st_dev)
    if fact.get("type") != "file":
        return fact
    try:
        fd = safefs.open_regular(dfd, name, path, safefs.writable_by_others(os.fstat(dfd)))
    except safefs.UnsafePath as e:
        fact.update(type="unsafe", unsafe=str(e))
        return fact
    if fd is None:
        return {"path": path, "exists": False}
    st = os.fstat(fd)
    with os.fdopen(fd, "rb") as f:
        h, data = sha256(), f.read() if st.st_size <= CONTENT_LIMIT else None
        if data is None:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        else:
            h.update(data)
    fact["sha256"] = h.hexdigest()
    if want_content is not None and want_content != fact["sha256"] and data is not None:
        fact["content_b64"] = binascii.b2a_base64(data, newline=False).decode()  # base64.b64encode's
    if name.endswith(".py"):
        try:
            cache = os.open(PYCACHE, safefs.O_DIR, dir_fd=dfd)
            try:
                fact["pycache"] = sorted(({"name": n, "mtime": os.stat(n, dir_fd=cache, follow_symlinks=False).st_mtime}
                                          for n in os.listdir(cache) if is_bytecode_of(n, name[:-3])),
                                         key=lambda p: p["name"])
            finally:
                os.close(cache)
        except OSError:
            fact["pycache"] = []
    return fact


SEEN = {}  # unit → (time.monotonic(), its fact): what this agent last asked systemd (textfile.unit_state reads it)


def unit_fact(name, reuse=False):
    """systemctl show's properties, start times as wall-clock seconds, and the unit file's text.
    With `reuse`, the fact kept from an earlier show while nothing it says can have changed
    (unitkeep); every show that may be kept is kept."""
    kept = unitkeep.load()
    fact = unitkeep.reuse(name, kept, procs.starttime) if reuse else None
    if fact is None:
        asked, fact = time.time(), {}
        for line in output(["systemctl", "show", name, "-p", ",".join(UNIT_PROPS)]).splitlines():
            k, _, v = line.partition("=")
            fact[k] = v
        unitkeep.keep(name, kept, dict(fact), asked, procs.starttime)
    for k in ("ActiveEnterTimestamp", "ExecMainStartTimestamp"):  # compared with file mtimes, at this clock
        fact[k] = wall_time(fact.pop(k + "Monotonic", "0"))
    try:
        with open(fact.get("FragmentPath") or "/nonexistent") as f:
            fact["text"] = f.read(65536)
    except OSError:
        fact["text"] = None
    SEEN[name] = (time.monotonic(), fact)
    return fact


def recent_unit_fact(name, within=2.0):
    """unit_fact as this agent read it in the last `within` seconds (a verify just after its
    probe: one systemctl call and PID 1's answer fewer per host), while the unit is active and
    its main process still runs; nothing this agent changed since (main forgets SEEN after every
    request that changes the host).  Else the kept fact while it holds (unitkeep), or asked now."""
    seen = SEEN.get(name)
    if seen and time.monotonic() - seen[0] < within and seen[1].get("ActiveState") == "active" \
            and seen[1].get("MainPID", "0") != "0" and os.path.exists("/proc/%s" % seen[1]["MainPID"]):
        return seen[1]
    return unit_fact(name, reuse=True)


def _cut_off(undo_it):
    """A switch an earlier run was cut off in (stage.Journal): said, and with `undo_it` undone
    first (rollback.cut_off, imported only then: it is rare)."""
    if not os.path.exists(APPLY_JOURNAL):
        return None
    from specops.agent.rollback import cut_off
    return cut_off(undo_it)


def probe(req):
    """Answer a protocol.Probe with a protocol.ProbeResult."""
    facts = protocol.ProbeResult(time=time.time(), hostname=os.uname()[1], python=sys.executable)
    if req.lock_acquire:
        facts.lock = lock.acquire(req.lock_acquire, req.break_lock)
        if not facts.lock["acquired"]:
            return facts  # gather nothing for a run that may not proceed
        facts.interrupted = _cut_off(undo_it=True)  # before anything else this run does
    elif not os.path.isdir(LOCK_DIR):
        facts.interrupted = _cut_off(undo_it=False)
    for venv in req.venvs:
        facts.venvs[venv] = venv_fact(venv)
    for key in req.files:
        path = resolve_key(key, facts.venvs)
        if path is None:
            facts.files[key] = {"path": None, "exists": False, "unresolved": True}
        else:
            facts.files[key] = file_fact(path, req.content.get(key), req.allow_shared_dirs)
    for key in req.upstream:
        facts.upstream[key] = upstream.fact(key, facts.venvs, req.allow_shared_dirs, facts.files.get(key))
    if req.stacks:
        from specops.agent.converge import stacks  # only then: it imports shutil and tempfile
        facts.stacks, facts.stacks_free = stacks.listing(), stacks.free()
    if req.wheel_files:
        from specops.agent.converge import wheelfiles  # only then: urllib costs the agent's start
        facts.wheel_files = wheelfiles.fact(req.wheel_files)
    for name in req.units:
        facts.units[name] = unit_fact(name, reuse=True)
    for d in req.listdirs:
        try:
            facts.listings[d] = {n: os.lstat(os.path.join(d, n)).st_size for n in os.listdir(d)}
        except OSError:
            facts.listings[d] = {}
    for d in req.weight_dirs:
        facts.weight_listings[d] = weight_listing(d)
    if req.weights:
        from specops.agent import weights  # only then: its hub client costs every other probe
        facts.weights = {dest: weights.fact(dest, req.allow_shared_dirs) for dest in req.weights}
    if req.gpu:
        facts.gpu = gpu_fact(req.units, seen=facts.units) if req.gpu_apps else \
            gpus.for_plan(req.gpu_units, facts.units, record=bool(facts.lock and facts.lock.get("acquired")))
    if req.packages:
        from specops.agent.converge import dpkg
        facts.packages = dpkg.states(req.packages)
    if req.checks:
        import subprocess  # only then: a no-op's probe runs no check
    for name, cmd in req.checks.items():
        facts.checks[name] = subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL).returncode
    if req.lock_peek and facts.lock is None:
        facts.lock = lock.peek()
    return facts


LISTED = 10000  # entries at most: more is no checkpoint, and the answer must stay small


def weight_listing(d):
    """The weight files at the top of directory `d` (name -> bytes it holds on disk), reached
    through root's links only ({}: not known).  Only regular files count, at most their
    allocated blocks: another user's link, a sparse file or a directory of a million names
    must never make the GPUs look too small (a refusal) nor the answer huge."""
    try:
        fd, _ = safefs.open_dir(d, for_writing=False)
    except (OSError, safefs.UnsafePath):
        return {}
    try:
        names = os.listdir(fd)
        if len(names) > LISTED:
            return {}
        out = {}
        for n in names:
            st = safefs.lstat_in(fd, n) if n.endswith((".safetensors", ".bin")) else None
            if st is not None and stat.S_ISREG(st.st_mode):
                out[n] = min(st.st_size, st.st_blocks * 512)
        return out
    except OSError:
        return {}
    finally:
        os.close(fd)
