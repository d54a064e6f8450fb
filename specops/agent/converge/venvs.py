"""Python venvs on the host: where each venv's own interpreter finds its packages (asked only
when the venv changed), and managed paths inside packages (pkg:<venv>:<package>/<path>)."""
import os

from specops.agent.host import clean
from specops.agent.lean import dumps, load, loads
from specops.layout import PKG_PREFIX, VENV_CACHE, split_pkg_key

# Run by a venv's own interpreter: where its packages are, without importing them.
VENV_PROBE = r"""
import importlib.util as iu, json, os, re, sys
out = {"python": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3],
       "tag": sys.implementation.cache_tag, "magic": iu.MAGIC_NUMBER.hex(), "packages": {}, "dirs": {}}
# Versions from the *.dist-info names on sys.path (what importlib.metadata reads, without its import cost).
wanted = {"torch": "torch", "flash_linear_attention": "flash-linear-attention", "fla_core": "fla-core",
          "sglang": "sglang", "sglang_router": "sglang-router"}
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
            cache = load(f)
    except (OSError, ValueError):
        cache = {}
    if update:
        cache.update(update)
        tmp = "%s.%d.tmp" % (VENV_CACHE, os.getpid())
        try:
            os.makedirs(os.path.dirname(VENV_CACHE), mode=0o700, exist_ok=True)
            with open(tmp, "w") as f:
                f.write(dumps(cache))
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
    # (a fact kept before "magic" was asked is asked again: the controller compiles by it)
    if known and "magic" in known["fact"] and _venv_stamp(py, known["fact"].get("path", [])) == known["stamp"]:
        return known["fact"]
    import subprocess  # only then: a venv asked again (not a no-op's)
    res = subprocess.run([py, "-I", "-c", VENV_PROBE], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    if res.returncode != 0:
        return {"exists": True, "broken": clean(res.stderr.strip()[-500:])}
    fact = loads(res.stdout)
    fact["exists"] = True
    _venv_cache({venv: {"stamp": _venv_stamp(py, fact["path"]), "fact": fact}})
    return fact


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
