"""Facts about the host, gathered in one pass for a plan: files, units, venvs, GPUs."""
import base64
import json
import os
import stat
import subprocess
import sys
import time

from specops import protocol
from specops.agent import lock, procs
from specops.agent.host import clean, group_name, sha256_file, user_name
from specops.layout import PKG_PREFIX, VENV_CACHE, is_bytecode_of, split_pkg_key

CONTENT_LIMIT = 2 * 1024 * 1024
UNIT_PROPS = ("LoadState", "ActiveState", "SubState", "ActiveEnterTimestampMonotonic",
              "ExecMainStartTimestampMonotonic", "ExecMainPID", "MainPID", "NRestarts",
              "ControlGroup", "FragmentPath", "UnitFileState", "Result", "InvocationID", "User")
# Run by a venv's own interpreter: where its packages are, without importing them.
VENV_PROBE = r"""
import importlib.util as iu, json, os, re, sys
out = {"python": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3],
       "tag": sys.implementation.cache_tag, "packages": {}, "dirs": {}}
# Versions from the *.dist-info names on sys.path (what importlib.metadata reads, without its import cost).
wanted = {"torch": "torch", "flash_linear_attention": "flash-linear-attention", "fla_core": "fla-core",
          "sglang": "sglang"}
out["packages"] = dict.fromkeys(wanted.values())
for entry in sys.path:
    try:
        names = os.listdir(entry or ".")
    except OSError:
        continue
    for n in names:
        if n.endswith(".dist-info"):
            name, _, version = n[:-10].partition("-")
            dist = wanted.get(re.sub(r"[-_.]+", "_", name).lower())
            if dist and out["packages"][dist] is None:
                out["packages"][dist] = version
for mod in ("sglang", "torch", "fla"):
    try:
        spec = iu.find_spec(mod)
    except Exception:
        spec = None
    out["dirs"][mod] = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None
# torch.version.cuda without importing torch (seconds, and a GPU context on real boxes).
cuda = None
if out["dirs"]["torch"]:
    try:
        text = open(os.path.join(out["dirs"]["torch"], "version.py")).read()
        m = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*(['\"]?)([^'\"\n]*)\1\s*$", text, re.M)
        cuda = None if not m or m.group(2) in ("None", "") else m.group(2)
    except OSError:
        pass
out["torch_cuda"] = cuda
out["path"] = [p for p in sys.path if p and os.path.isdir(p)]
print(json.dumps(out))
"""
NOT_REPORTED = ("[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[Insufficient Permissions]")


def file_fact(path, want_content=None):
    """What is at `path` (never following a link): type, size, mtime, mode, owner, sha256, and
    the content when the controller's sha256 differs; for a .py, its cached bytecode."""
    try:
        st = os.lstat(path)
    except OSError:
        return {"path": path, "exists": False}
    fact = {"path": path, "exists": True, "mtime": st.st_mtime, "size": st.st_size,
            "mode": "%04o" % stat.S_IMODE(st.st_mode),
            "owner": user_name(st.st_uid), "group": group_name(st.st_gid)}
    if stat.S_ISDIR(st.st_mode):
        fact["type"] = "dir"
        return fact
    if stat.S_ISLNK(st.st_mode):
        fact["type"] = "link"
        return fact
    if not stat.S_ISREG(st.st_mode):
        fact["type"] = "other"
        return fact
    fact["type"] = "file"
    try:
        fact["sha256"] = sha256_file(path)
    except OSError as e:
        fact["error"] = str(e)
        return fact
    if want_content is not None and want_content != fact["sha256"] and st.st_size <= CONTENT_LIMIT:
        with open(path, "rb") as f:
            fact["content_b64"] = base64.b64encode(f.read()).decode()
    if path.endswith(".py"):
        d, base = os.path.split(path)
        cache = os.path.join(d, "__pycache__")
        try:
            names = sorted(n for n in os.listdir(cache) if is_bytecode_of(n, base[:-3]))
            fact["pycache"] = [{"name": n, "mtime": os.lstat(os.path.join(cache, n)).st_mtime} for n in names]
        except OSError:
            fact["pycache"] = []
    return fact


def unit_fact(name):
    """systemctl show's properties, start times as wall-clock seconds, and the unit file's text."""
    res = subprocess.run(["systemctl", "show", name, "-p", ",".join(UNIT_PROPS)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    fact = {}
    for line in res.stdout.splitlines():
        k, _, v = line.partition("=")
        fact[k] = v
    # Wall-clock times to the microsecond (compared with file mtimes), from systemd's
    # monotonic stamps: its realtime properties print whole seconds only.
    offset = time.time() - time.monotonic()
    for k in ("ActiveEnterTimestamp", "ExecMainStartTimestamp"):
        mono = int(fact.pop(k + "Monotonic", "0") or 0)
        fact[k] = offset + mono / 1e6 if mono else None
    try:
        with open(fact.get("FragmentPath") or "/nonexistent") as f:
            fact["text"] = f.read(65536)
    except OSError:
        fact["text"] = None
    return fact


def _venv_stamp(py, paths):
    """What changes when a venv's interpreter or packages change: the interpreter's identity and
    the mtime of every directory on its path (installing or removing a package adds or removes
    entries there)."""
    stamp = []
    for p in [py] + paths:
        try:
            st = os.stat(p)
            stamp.append([p, st.st_ino, st.st_mtime_ns])
        except OSError:
            stamp.append([p, None, None])
    return stamp


def _venv_cache(update=None):
    """venv → {stamp, fact}: what the interpreter said last time (a cache: losing it costs time only)."""
    try:
        with open(VENV_CACHE) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    if update:
        cache.update(update)
        tmp = "%s.%d.tmp" % (VENV_CACHE, os.getpid())
        try:
            os.makedirs(os.path.dirname(VENV_CACHE), mode=0o700, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(cache, f)
            os.rename(tmp, VENV_CACHE)
        except OSError:
            pass
    return cache


def venv_fact(venv):
    """Where the venv's interpreter finds its packages, and their versions.  The interpreter is
    asked only when the venv changed since it was last asked."""
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        return {"exists": False}
    known = _venv_cache().get(venv)
    if known and _venv_stamp(py, known["fact"].get("path", [])) == known["stamp"]:
        return known["fact"]
    res = subprocess.run([py, "-c", VENV_PROBE], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    if res.returncode != 0:
        return {"exists": True, "broken": clean(res.stderr.strip()[-500:])}
    fact = json.loads(res.stdout)
    fact["exists"] = True
    _venv_cache({venv: {"stamp": _venv_stamp(py, fact["path"]), "fact": fact}})
    return fact


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


def gpu_fact(unit_names=()):
    """nvidia-smi's GPUs and compute apps; memory nvidia-smi cannot report is None (and named in
    `unknown`); each app is attributed to one of `unit_names` when it belongs to one of its runs."""
    smi = which("nvidia-smi")
    if not smi:
        return {"present": False}

    def query(kind, fields):
        res = subprocess.run([smi, "--query-%s=%s" % (kind, ",".join(fields)),
                              "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True)
        if res.returncode != 0:
            raise RuntimeError(res.stderr.strip() or res.stdout.strip())
        return [dict(zip(fields, [c.strip() for c in line.split(",")]))
                for line in res.stdout.strip().splitlines() if line.strip()]

    try:
        gpus = query("gpu", ["index", "uuid", "name", "driver_version", "memory.total", "memory.used"])
        apps = query("compute-apps", ["pid", "gpu_uuid", "used_memory"])
    except Exception as e:
        return {"present": True, "error": clean(str(e))[-300:]}
    unknown = []
    for g in gpus:
        for k in ("memory.total", "memory.used"):
            if g[k] in NOT_REPORTED or _mib(g[k]) is None:
                unknown.append("GPU %s %s (%s)" % (g["index"], k, g[k]))
            g[k] = _mib(g[k])
    index = {g["uuid"]: g["index"] for g in gpus}
    owners = procs.attribute([int(a["pid"]) for a in apps if a["pid"].isdigit()], unit_names)
    out = []
    for a in apps:
        if not a["pid"].isdigit():
            continue
        pid = int(a["pid"])
        if a["used_memory"] in NOT_REPORTED:
            unknown.append("pid %d used_memory (%s)" % (pid, a["used_memory"]))
        p = procs.describe(pid, _mib(a["used_memory"]), owners.get(pid))
        p["gpu"] = index.get(a["gpu_uuid"])
        out.append(p)
    return {"present": True, "gpus": gpus, "apps": out, "unknown": unknown,
            "driver": gpus[0]["driver_version"] if gpus else None}


def resolve_key(key, venvs=None):
    """A managed path's real path: pkg: keys through the venv's interpreter (None if absent)."""
    if not key.startswith(PKG_PREFIX):
        return key
    venv, package, inner = split_pkg_key(key)
    v = venvs.get(venv) if venvs is not None else None
    if v is None:
        v = venv_fact(venv)
        if venvs is not None:
            venvs[venv] = v
    base = (v.get("dirs") or {}).get(package)
    return os.path.join(base, inner) if base else None


def probe(req):
    """Answer a protocol.Probe with a protocol.ProbeResult."""
    facts = protocol.ProbeResult(time=time.time(), hostname=os.uname()[1], python=sys.executable)
    if req.lock_acquire:
        facts.lock = lock.acquire(req.lock_acquire, req.break_lock)
        if not facts.lock["acquired"]:
            return facts  # gather nothing for a run that may not proceed
    for venv in req.venvs:
        facts.venvs[venv] = venv_fact(venv)
    for key in req.files:
        path = resolve_key(key, facts.venvs)
        if path is None:
            facts.files[key] = {"path": None, "exists": False, "unresolved": True}
        else:
            facts.files[key] = file_fact(path, req.content.get(key))
    for name in req.units:
        facts.units[name] = unit_fact(name)
    for d in req.listdirs:
        try:
            facts.listings[d] = {n: os.lstat(os.path.join(d, n)).st_size for n in os.listdir(d)}
        except OSError:
            facts.listings[d] = {}
    if req.gpu:
        facts.gpu = gpu_fact(req.units)
    for name, cmd in req.checks.items():
        facts.checks[name] = subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL).returncode
    if req.lock_peek and facts.lock is None:
        facts.lock = lock.peek()
    return facts
