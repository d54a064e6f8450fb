"""The program specops runs on a host: one invocation is one round trip.

It is sent over SSH on stdin to the host's python3 and must run on Python 3.7+
with the standard library alone.  ``probe`` gathers every fact the ops asked
for; ``apply`` executes a batch of actions.  Apply stages and validates every
file it can before it changes anything, so a bad file refuses the whole batch.
"""
import base64
import grp
import hashlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time

STAGE = ".specops-stage"
CONTENT_LIMIT = 2 * 1024 * 1024
UNIT_PROPS = ("LoadState", "ActiveState", "SubState", "ActiveEnterTimestampMonotonic",
              "ExecMainStartTimestampMonotonic", "ExecMainPID", "MainPID", "NRestarts",
              "ControlGroup", "FragmentPath", "UnitFileState", "Result")
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
print(json.dumps(out))
"""

_staged = []  # temp paths to remove if we are interrupted
_children = []  # commands we run, to stop with us


def _cleanup(*_):
    for tmp in _staged:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    for proc in _children:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass
    os._exit(130)


def _die_with_connection():
    # If the SSH session dies, sshd's child (us) must not finish a half batch.
    signal.signal(signal.SIGTERM, _cleanup)
    signal.signal(signal.SIGHUP, _cleanup)
    signal.signal(signal.SIGINT, _cleanup)
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _name(getter, ident):
    try:
        return getter(ident)[0]
    except KeyError:
        return str(ident)


def file_fact(path, want_content=None):
    try:
        st = os.lstat(path)
    except OSError:
        return {"path": path, "exists": False}
    fact = {"path": path, "exists": True, "mtime": st.st_mtime, "size": st.st_size,
            "mode": "%04o" % stat.S_IMODE(st.st_mode),
            "owner": _name(pwd.getpwuid, st.st_uid), "group": _name(grp.getgrgid, st.st_gid)}
    if stat.S_ISDIR(st.st_mode):
        fact["type"] = "dir"
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
        mod = base[:-3]
        cache = os.path.join(d, "__pycache__")
        try:
            names = sorted(n for n in os.listdir(cache) if _is_bytecode_of(n, mod))
            fact["pycache"] = [{"name": n, "mtime": os.stat(os.path.join(cache, n)).st_mtime} for n in names]
        except OSError:
            fact["pycache"] = []
    return fact


def _is_bytecode_of(filename, module):
    """<module>.<tag>[.opt-N].pyc: every interpreter tag and optimisation level."""
    return filename.startswith(module + ".") and filename.endswith(".pyc") \
        and filename[len(module) + 1:].count(".") >= 1


def unit_fact(name):
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


def venv_fact(venv):
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        return {"exists": False}
    res = subprocess.run([py, "-c", VENV_PROBE], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    if res.returncode != 0:
        return {"exists": True, "broken": res.stderr.strip()[-500:]}
    fact = json.loads(res.stdout)
    fact["exists"] = True
    return fact


def gpu_fact():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {"present": False}

    def query(kind, fields):
        res = subprocess.run([smi, "--query-%s=%s" % (kind, ",".join(fields)),
                              "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True)
        if res.returncode != 0:
            raise RuntimeError(res.stderr.strip() or res.stdout.strip())
        rows = []
        for line in res.stdout.strip().splitlines():
            rows.append(dict(zip(fields, [c.strip() for c in line.split(",")])))
        return rows

    try:
        gpus = query("gpu", ["index", "uuid", "name", "driver_version", "memory.total", "memory.used"])
        apps = query("compute-apps", ["pid", "gpu_uuid", "used_memory"])
    except Exception as e:
        return {"present": True, "error": str(e)[-300:]}
    return {"present": True, "gpus": gpus, "apps": apps,
            "driver": gpus[0]["driver_version"] if gpus else None}


LOCK_DIR = "/run/specops.lock"


def _lock(req):
    """mkdir is atomic: whoever creates the directory holds the lock."""
    if req.get("break"):
        shutil.rmtree(LOCK_DIR, ignore_errors=True)
    try:
        os.mkdir(LOCK_DIR, 0o700)
    except FileExistsError:
        try:
            with open(os.path.join(LOCK_DIR, "holder.json")) as f:
                holder = json.load(f)
        except (OSError, ValueError):
            holder = {"holder": "unknown (no holder.json)"}
        return {"acquired": False, "holder": holder}
    with open(os.path.join(LOCK_DIR, "holder.json"), "w") as f:
        json.dump(req["holder"], f)
    return {"acquired": True, "token": req["holder"]["token"]}


def unlock(req):
    try:
        with open(os.path.join(LOCK_DIR, "holder.json")) as f:
            mine = json.load(f).get("token") == req["token"]
    except (OSError, ValueError):
        mine = False
    if mine:
        shutil.rmtree(LOCK_DIR, ignore_errors=True)
    return {"released": mine}


def probe(req):
    facts = {"time": time.time(), "hostname": os.uname()[1], "python": sys.executable,
             "venvs": {}, "files": {}, "units": {}, "checks": {}}
    if req.get("lock_acquire"):
        facts["lock"] = _lock(req["lock_acquire"])
        if not facts["lock"]["acquired"]:
            return facts  # gather nothing for a run that may not proceed
    for venv in req.get("venvs", []):
        facts["venvs"][venv] = venv_fact(venv)
    content = req.get("content", {})
    for key in req.get("files", []):
        path = key
        if key.startswith("pkg:"):
            # pkg:<venv>:<package>/<relative path>, resolved with the venv's own interpreter.
            _, venv, rel = key.split(":", 2)
            package, _, inner = rel.partition("/")
            v = facts["venvs"].get(venv) or venv_fact(venv)
            facts["venvs"][venv] = v
            base = (v.get("dirs") or {}).get(package)
            if not base:
                facts["files"][key] = {"path": None, "exists": False, "unresolved": True}
                continue
            path = os.path.join(base, inner)
        facts["files"][key] = file_fact(path, content.get(key))
    for name in req.get("units", []):
        facts["units"][name] = unit_fact(name)
    facts["listings"] = {}
    for d in req.get("listdirs", []):
        try:
            facts["listings"][d] = {n: os.stat(os.path.join(d, n)).st_size for n in os.listdir(d)}
        except OSError:
            facts["listings"][d] = {}
    if req.get("gpu"):
        facts["gpu"] = gpu_fact()
    for name, cmd in req.get("checks", {}).items():
        facts["checks"][name] = subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL).returncode
    if req.get("lock") and "lock" not in facts:
        try:
            with open(os.path.join(req["lock"], "holder.json")) as f:
                facts["lock"] = {"held": True, "holder": json.load(f)}
        except (OSError, ValueError):
            facts["lock"] = {"held": os.path.isdir(req["lock"])}
    return facts


class ActionError(Exception):
    pass


def _ids(owner, group):
    uid = pwd.getpwnam(owner).pw_uid if owner else -1
    gid = grp.getgrnam(group).gr_gid if group else -1
    return uid, gid


def _stage(action):
    """Write the new content beside its target and validate it.  Returns the temp path."""
    target = action["path"]
    stage_dir = os.path.join(os.path.dirname(target), STAGE)
    os.makedirs(stage_dir, mode=0o700, exist_ok=True)
    tmp = os.path.join(stage_dir, os.path.basename(target))
    data = base64.b64decode(action["data"])
    _staged.append(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            os.fchmod(fd, int(action.get("mode") or "0644", 8))
            uid, gid = _ids(action.get("owner"), action.get("group"))
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
    except OSError as e:
        _unstage(tmp)
        raise ActionError("cannot write %s: %s" % (target, e.strerror))
    if action.get("validate"):
        argv = [a.replace("{}", tmp) for a in action["validate"]]
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True)
        if res.returncode != 0:
            _unstage(tmp)
            lines = [l.strip() for l in res.stdout.replace(tmp, target).splitlines() if l.strip()]
            raise ActionError("%s refused %s: %s" % (action.get("validator") or argv[0],
                                                    action.get("label") or target,
                                                    " | ".join(lines[-3:])[-800:] or "exit %d" % res.returncode))
    return tmp


def _unstage(tmp):
    try:
        os.unlink(tmp)
    except OSError:
        pass
    if tmp in _staged:
        _staged.remove(tmp)
    _remove_stage_dir(tmp)


def _remove_stage_dir(tmp):
    try:
        os.rmdir(os.path.dirname(tmp))  # only when empty: another file may be staged there
    except OSError:
        pass


def _backup(path, backup):
    if backup and os.path.lexists(path):
        os.makedirs(os.path.dirname(backup), mode=0o700, exist_ok=True)
        shutil.copy2(path, backup)


def _commit(action, tmp):
    path = action["path"]
    _backup(path, action.get("backup"))
    os.rename(tmp, path)
    _staged.remove(tmp)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    _remove_stage_dir(tmp)


def _run(argv_or_cmd, desc):
    shell = isinstance(argv_or_cmd, str)
    proc = subprocess.Popen(argv_or_cmd, shell=shell, stdout=subprocess.PIPE, start_new_session=True,
                            stderr=subprocess.STDOUT, universal_newlines=True, bufsize=1)
    _children.append(proc)
    tail, t0 = [], time.time()
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-30:]
        sys.stderr.write("  | %5.1fs %s\n" % (time.time() - t0, line.rstrip()))
        sys.stderr.flush()
    rc = proc.wait()
    if rc != 0:
        # The lines that say why: pip's ERROR lines, else the last few.
        why = [l.strip() for l in tail if l.strip().startswith("ERROR")] or [l.strip() for l in tail if l.strip()][-3:]
        raise ActionError("%s failed (exit %d): %s" % (desc, rc, " | ".join(why)[-1500:]))


STATE_FILE = "/var/lib/specops/state.json"


def _read_state():
    try:
        with open(STATE_FILE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_state(state):
    os.makedirs(os.path.dirname(STATE_FILE), mode=0o700, exist_ok=True)
    tmp = STATE_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, STATE_FILE)


def _purge(a):
    """Remove every cached bytecode of a module, check none is left, record when."""
    py = a["path"]
    d, base = os.path.split(py)
    mod = base[:-3]
    cache = os.path.join(d, "__pycache__")
    removed = []
    if os.path.isdir(cache):
        for n in os.listdir(cache):
            if _is_bytecode_of(n, mod):
                os.unlink(os.path.join(cache, n))
                removed.append(n)
        left = [n for n in os.listdir(cache) if _is_bytecode_of(n, mod)]
        if left:
            raise ActionError("bytecode for %s still present after purge: %s" % (py, left))
    state = _read_state()
    state.setdefault("purges", {})[py] = {"sha256": a["sha256"], "purged_at": time.time(), "removed": removed}
    _write_state(state)
    return removed


def _preflight(a):
    """The installed SGLang's own resolver, on these exact arguments, before anything restarts."""
    res = subprocess.run([a["python"], "-c", a["script"]], input=json.dumps([a["argv"]]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if res.returncode != 0:
        raise ActionError("host preflight could not run SGLang's resolver in %s: %s"
                          % (a["python"], res.stderr.strip()[-500:]))
    result = json.loads(res.stdout)[0]
    if not result["ok"]:
        raise ActionError("host preflight: the installed SGLang refuses these arguments: %s" % result["error"])
    return _compare_expect(result["values"], a["expect"],
                           "host preflight (the installed SGLang's own resolver) refuses %s"
                           % a.get("service", "the service"))


def _compare_expect(got, expect, what):
    diffs = ["%s: intended %s, effective %s" % (k, v, got.get(k))
             for k, v in sorted(expect.items()) if got.get(k) != v]
    if diffs:
        raise ActionError("%s: %s" % (what, "; ".join(diffs)))
    return got


def _expect(a):
    """Run code with an interpreter; its JSON answer must hold the expected values."""
    res = subprocess.run([a["python"], "-c", a["code"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    if res.returncode != 0:
        lines = [l for l in res.stderr.strip().splitlines() if l.strip()]
        raise ActionError("%s: %s" % (a["what"], " | ".join(lines[-2:]) or "exit %d" % res.returncode))
    return _compare_expect(json.loads(res.stdout), a["expect"], a["what"])


def apply(req):
    actions = req["actions"]
    staged = {}
    results = []
    # Stage and validate everything we can before touching anything.
    for i, a in enumerate(actions):
        if a["kind"] == "write" and os.path.isdir(os.path.dirname(a["path"])):
            try:
                staged[i] = _stage(a)
            except ActionError as e:
                for tmp in list(staged.values()):
                    _unstage(tmp)
                return {"ok": False, "failed": i, "error": str(e), "results": []}
    # Preflights ask "will this work?" of the host: they run before anything is changed.
    order = [i for i, a in enumerate(actions) if a["kind"] == "preflight"]
    order += [i for i, a in enumerate(actions) if a["kind"] != "preflight"]
    total = len(actions)
    for n, i in enumerate(order):
        a = actions[i]
        kind = a["kind"]
        sys.stderr.write("  [%d/%d] %s\n" % (n + 1, total, a.get("desc", kind)))
        sys.stderr.flush()
        try:
            out = None
            if kind == "write":
                _commit(a, staged.pop(i) if i in staged else _stage(a))
            elif kind == "mkdir":
                os.makedirs(a["path"], exist_ok=True)
                os.chmod(a["path"], int(a.get("mode") or "0755", 8))
                os.chown(a["path"], *_ids(a.get("owner"), a.get("group")))
            elif kind == "attrs":
                if a.get("mode"):
                    os.chmod(a["path"], int(a["mode"], 8))
                os.chown(a["path"], *_ids(a.get("owner"), a.get("group")))
            elif kind == "remove":
                _backup(a["path"], a.get("backup"))
                if os.path.isdir(a["path"]) and not os.path.islink(a["path"]):
                    shutil.rmtree(a["path"])
                elif os.path.lexists(a["path"]):
                    os.unlink(a["path"])
            elif kind == "purge":
                out = _purge(a)
            elif kind == "run":
                _run(a["cmd"], a.get("desc", "command"))
            elif kind == "preflight":
                out = _preflight(a)
            elif kind == "expect":
                out = _expect(a)
            else:
                raise ActionError("unknown action %r" % kind)
            results.append({"index": i, "out": out})
        except (ActionError, OSError, KeyError) as e:
            for tmp in list(staged.values()):
                _unstage(tmp)
            msg = str(e) if isinstance(e, ActionError) else "%s: %s" % (a.get("desc", kind), e)
            return {"ok": False, "failed": i, "error": msg, "results": results}
    return {"ok": True, "results": results}


# ---- verify: wait for ready, then compare what runs with what was intended ----

def _http(svc, method, path, body=None, timeout=30):
    import urllib.error
    import urllib.request
    url = "http://%s:%d%s" % (svc.get("host", "127.0.0.1"), svc["port"], path)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if svc.get("api_key") and not path.startswith("/health"):
        req.add_header("Authorization", "Bearer " + svc["api_key"])
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, raw
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _journal(unit, lines=25):
    res = subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    return res.stdout.strip()


def _say(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _wait_ready(svc, report):
    name, t0 = svc["name"], time.time()
    deadline = t0 + svc.get("timeout", 600)
    last_note, statuses = 0.0, []
    while True:
        u = unit_fact(name)
        if u.get("ActiveState") in ("failed", "inactive") or u.get("SubState") == "auto-restart":
            report["failures"].append("unit %s is %s/%s after %.1fs: the server exited" % (
                name, u.get("ActiveState"), u.get("SubState"), time.time() - t0))
            report["journal"] = _journal(name)
            return False
        try:
            status, _ = _http(svc, "GET", "/health", timeout=5)
        except OSError:
            status = "no listener"
        if not statuses or statuses[-1] != status:
            statuses.append(status)
        if status == 200:
            report["ready_after"] = round(time.time() - t0, 2)
            report["health_statuses"] = statuses
            _say("  %s: ready after %.1fs" % (name, time.time() - t0))
            return True
        now = time.time()
        if now > deadline:
            report["failures"].append("not ready after %.0fs (last /health: %s)" % (now - t0, status))
            report["journal"] = _journal(name)
            return False
        if now - last_note >= 2:
            _say("  %s: starting (/health: %s) %.0fs elapsed" % (name, status, now - t0))
            last_note = now
        time.sleep(0.5)


def _compare(svc, info, report):
    for field, want in sorted(svc.get("intended", {}).items()):
        have = info.get(field)
        if have == want:
            continue
        accepted = svc.get("accepted", {})
        text = "%s: intended %s, effective %s" % (field, want, have)
        if field in accepted and accepted[field] == have:
            report["notes"].append(text + " (accepted SGLang adjustment)")
        else:
            report["failures"].append(text)


def _verify_service(svc):
    report = {"name": svc["name"], "failures": [], "notes": [], "checks": []}
    if not _wait_ready(svc, report):
        return report
    status, raw = _http(svc, "GET", "/v1/models")
    ids = [m.get("id") for m in json.loads(raw).get("data", [])] if status == 200 else []
    if svc.get("served_model_name") and svc["served_model_name"] not in ids:
        report["failures"].append("/v1/models lists %s, not %s" % (ids or status, svc["served_model_name"]))
    report["checks"].append("/v1/models: %s" % ", ".join(map(str, ids)))
    status, raw = _http(svc, "GET", "/server_info")
    if status == 404:
        status, raw = _http(svc, "GET", "/get_server_info")
    if status != 200:
        report["failures"].append("/server_info answered %s" % status)
        return report
    info = json.loads(raw)
    report["effective"] = {k: info.get(k) for k in svc.get("intended", {})}
    _compare(svc, info, report)
    t0 = time.time()
    status, raw = _http(svc, "POST", "/generate", {
        "text": svc.get("prompt", "The capital of France is"),
        "sampling_params": {"max_new_tokens": svc.get("max_new_tokens", 32), "temperature": 0}},
        timeout=svc.get("timeout", 600))
    wall = time.time() - t0
    if status != 200:
        report["failures"].append("/generate answered %s: %s" % (status, raw[:200]))
        return report
    meta = json.loads(raw).get("meta_info", {})
    tokens = meta.get("completion_tokens") or 0
    tok_s = tokens / wall if wall > 0 else 0.0
    report["generate"] = {"completion_tokens": tokens, "tok_s": round(tok_s, 1),
                          "spec_verify_ct": meta.get("spec_verify_ct"),
                          "spec_accept_length": meta.get("spec_accept_length")}
    accept = meta.get("spec_accept_length")
    if svc.get("min_accept_length") is not None and (accept is None or accept < svc["min_accept_length"]):
        report["failures"].append("spec_accept_length %s is below min_accept_length %s"
                                  % (accept, svc["min_accept_length"]))
    if svc.get("baseline_tok_s") is not None and tok_s < svc["baseline_tok_s"]:
        report["failures"].append("%.1f tok/s is slower than the baseline without speculation (%s tok/s)"
                                  % (tok_s, svc["baseline_tok_s"]))
    _stale_check(svc, report)
    return report


def _stale_check(svc, report):
    """The process must have started after every managed file changed (else it runs old code)."""
    started = unit_fact(svc["name"]).get("ExecMainStartTimestamp")
    newest = _newest_change(svc.get("managed", []))
    if started and newest and newest[0] > started:
        report["failures"].append("running old code: the service started at %s, before %s changed at %s"
                                  % (time.strftime("%H:%M:%S", time.gmtime(started)), newest[1],
                                     time.strftime("%H:%M:%S", time.gmtime(newest[0]))))
        report["stale"] = True


def _resolve_key(key):
    if not key.startswith("pkg:"):
        return key
    _, venv, rel = key.split(":", 2)
    package, _, inner = rel.partition("/")
    base = (venv_fact(venv).get("dirs") or {}).get(package)
    return os.path.join(base, inner) if base else None


def _newest_change(keys):
    """(time, what) of the latest change to a managed file or bytecode purge among `keys`."""
    purges = _read_state().get("purges", {})
    events = []
    for key in keys:
        path = _resolve_key(key)
        if path and os.path.exists(path):
            events.append((os.stat(path).st_mtime, path))
        if path in purges:
            events.append((purges[path]["purged_at"], "the bytecode purge of " + path))
    return max(events) if events else None


def _api_key_from_env_file(svc):
    """Rollback verifies a release from its manifest, which holds no secrets: read the key here."""
    try:
        with open("/etc/specops/%s.env" % svc["name"]) as f:
            for line in f:
                if line.startswith("SGLANG_SPECOPS_API_KEY="):
                    value = line.split("=", 1)[1].strip()
                    return json.loads(value) if value.startswith('"') else value
    except (OSError, ValueError):
        pass
    return None


def peek(req):
    """The running servers' effective args against the intended ones: /server_info only."""
    out = []
    for svc in req["services"]:
        svc.setdefault("api_key", _api_key_from_env_file(svc))
        report = {"name": svc["name"], "failures": [], "notes": []}
        try:
            status, raw = _http(svc, "GET", "/server_info", timeout=5)
            if status == 404:
                status, raw = _http(svc, "GET", "/get_server_info", timeout=5)
            info = json.loads(raw) if status == 200 else {}
        except (OSError, ValueError):
            status, info = "no answer", {}
        if status != 200:
            report["failures"].append("/server_info: %s" % status)
        else:
            report["effective"] = {k: info.get(k) for k in svc.get("intended", {})}
            _compare(svc, info, report)
        out.append(report)
    return {"services": out}


def verify(req):
    for svc in req["services"]:
        if not svc.get("api_key"):
            svc["api_key"] = _api_key_from_env_file(svc)
    return {"services": [_verify_service(svc) for svc in req["services"]]}


# ---- releases: /var/lib/specops/releases/<stamp>/{manifest.json, files/, previous/} ----

RELEASES = "/var/lib/specops/releases"
KEEP = 5


def _manifests():
    out = []
    try:
        names = sorted(os.listdir(RELEASES))
    except OSError:
        return out
    for n in names:
        if n == "current" or n.endswith(".tmp"):
            continue
        try:
            with open(os.path.join(RELEASES, n, "manifest.json")) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


def _current():
    try:
        return os.readlink(os.path.join(RELEASES, "current"))
    except OSError:
        return None


def _set_current(stamp):
    link = os.path.join(RELEASES, "current")
    tmp = link + ".tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(stamp, tmp)
    os.rename(tmp, link)


def _snapshot_fact(path):
    st = os.stat(path)
    return {"sha256": sha256_file(path), "mode": "%04o" % stat.S_IMODE(st.st_mode),
            "owner": _name(pwd.getpwuid, st.st_uid), "group": _name(grp.getgrgid, st.st_gid)}


def release_record(req):
    """After a verified deploy: snapshot every managed file, write the manifest, move current."""
    d = os.path.join(RELEASES, req["stamp"])
    os.makedirs(os.path.join(d, "files"), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(d), 0o700)
    files = {}
    for key in req["managed"]:
        path = _resolve_key(key)
        if path and os.path.isfile(path):
            dest = os.path.join(d, "files", path.lstrip("/"))
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
            shutil.copy2(path, dest)
            files[path] = _snapshot_fact(path)
    previous = {}
    for path, how in req.get("previous", {}).items():
        backup = os.path.join(d, "previous", path.lstrip("/"))
        previous[path] = _snapshot_fact(backup) if how == "backup" and os.path.exists(backup) else None
    manifest = dict(req["manifest"], stamp=req["stamp"], status=req.get("status", "deployed"),
                    files=files, previous=previous, recorded_at=time.time())
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    if manifest["status"] == "deployed":
        _set_current(req["stamp"])
    _prune()
    return {"stamp": req["stamp"], "files": len(files)}


def _prune():
    current = _current()
    names = sorted(n for n in os.listdir(RELEASES) if n != "current" and not n.endswith(".tmp"))
    for n in names[:-KEEP]:
        if n != current:
            shutil.rmtree(os.path.join(RELEASES, n), ignore_errors=True)


def releases(req):
    current = _current()
    return {"current": current, "releases": [
        {"stamp": m["stamp"], "status": m.get("status"), "services": m.get("services", []),
         "files": len(m.get("files", {})), "current": m["stamp"] == current,
         "summary": m.get("summary", ""), "verify": m.get("verify", [])} for m in _manifests()]}


def _state_at(target, manifests):
    """path → content source (or None: absent) that puts the host back to release `target`."""
    later = [m for m in manifests if m["stamp"] > target["stamp"] and m.get("status") == "deployed"]
    want = {}
    for m in later:  # earliest first: the content a path had before it was first changed after target
        for path, prev in m.get("previous", {}).items():
            if path not in target["files"] and path not in want:
                want[path] = os.path.join(RELEASES, m["stamp"], "previous", path.lstrip("/")) if prev else None
    for path in target["files"]:
        want[path] = os.path.join(RELEASES, target["stamp"], "files", path.lstrip("/"))
    return want


def _restore(want):
    """Put files back atomically; purge bytecode of restored modules.  Returns what changed."""
    changed = []
    for path, src in sorted(want.items()):
        if src is None:
            if os.path.lexists(path):
                os.unlink(path)
                changed.append(path)
            continue
        if os.path.exists(path) and sha256_file(path) == sha256_file(src):
            continue
        st = os.stat(src)
        tmp = _stage({"path": path, "data": base64.b64encode(open(src, "rb").read()).decode(),
                      "mode": "%04o" % stat.S_IMODE(st.st_mode)})
        _commit({"path": path}, tmp)
        changed.append(path)
    for path in changed:
        if path.endswith(".py") and os.path.exists(path):
            _purge({"path": path, "sha256": sha256_file(path)})
    return changed


def _restart(services, daemon_reload):
    if daemon_reload:
        _run(["systemctl", "daemon-reload"], "daemon-reload")
    for name in services:
        _run(["systemctl", "restart", name], "restart " + name)


def undo(req):
    """Undo a deploy whose verify failed: its own backups back in place, created files removed."""
    d = os.path.join(RELEASES, req["stamp"])
    want = {p: (os.path.join(d, "previous", p.lstrip("/")) if how == "backup" else None)
            for p, how in req["previous"].items()}
    changed = _restore(want)
    _restart(req["services"], any(p.endswith(".service") for p in changed))
    current = _current()
    manifest = next((m for m in _manifests() if m["stamp"] == current), {})
    return {"restored": changed, "current": current, "verify": manifest.get("verify", [])}


def rollback(req):
    """Back to the release before current (or req['to']): files, bytecode, reload, restart."""
    manifests = [m for m in _manifests() if m.get("status") == "deployed"]
    current = _current()
    if req.get("to"):
        target = next((m for m in manifests if m["stamp"] == req["to"]), None)
        if target is None:
            raise ActionError("no deployed release %s (see inv releases)" % req["to"])
    else:
        older = [m for m in manifests if current and m["stamp"] < current]
        if not older:
            raise ActionError("no release before %s to roll back to" % (current or "the first deploy"))
        target = older[-1]
    changed = _restore(_state_at(target, manifests))
    _restart(target.get("services", []), any(p.endswith(".service") for p in changed))
    _set_current(target["stamp"])
    return {"to": target["stamp"], "from": current, "restored": changed, "verify": target.get("verify", [])}


# ---- stop: the service, then anything of it that still holds GPU memory ----

def _proc_env(pid, name):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(name.encode() + b"="):
                    return item.split(b"=", 1)[1].decode()
    except OSError:
        pass
    return None


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _belongs(pid, svc, invocation):
    """The service's own processes, even outside its cgroup: same systemd invocation, or its command."""
    if invocation and _proc_env(pid, "INVOCATION_ID") == invocation:
        return True
    cmd = _cmdline(pid)
    return "sglang" in cmd and ("--port %d" % svc["port"]) in cmd


def _apps():
    g = gpu_fact()
    return g.get("apps", []) if g.get("present") else []


def _gpu_used():
    g = gpu_fact()
    return {x["index"]: int(x["memory.used"]) for x in g.get("gpus", [])} if g.get("present") else {}


def stop(req):
    out = []
    for svc in req["services"]:
        name = svc["name"]
        invocation = subprocess.run(["systemctl", "show", "-p", "InvocationID", "--value", name],
                                    stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()
        before = _gpu_used()
        held = [a for a in _apps() if _belongs(int(a["pid"]), svc, invocation)]
        t0 = time.time()
        _say("  %s: systemctl stop (TimeoutStopSec bounds it)" % name)
        subprocess.run(["systemctl", "stop", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        report = {"name": name, "held_before_mib": sum(int(a["used_memory"]) for a in held),
                  "killed": [], "failures": []}
        deadline = time.time() + svc.get("settle", 3)
        leftover = []
        while True:  # processes can take a moment to release their contexts
            leftover = sorted({int(a["pid"]) for a in _apps() if _belongs(int(a["pid"]), svc, invocation)})
            if not leftover or time.time() > deadline:
                break
            time.sleep(0.3)
        for pid in leftover:
            report["killed"].append({"pid": pid, "cmd": _cmdline(pid)[:80]})
            _signal(pid, signal.SIGTERM)
        grace = time.time() + svc.get("grace", 10)
        while leftover and time.time() < grace:
            leftover = [p for p in leftover if _alive(p)]
            time.sleep(0.2)
        for pid in leftover:
            _signal(pid, signal.SIGKILL)
            for k in report["killed"]:
                if k["pid"] == pid:
                    k["signal"] = "SIGKILL"
        deadline = time.time() + 5
        while leftover and time.time() < deadline:
            leftover = [p for p in leftover if _alive(p)]
            time.sleep(0.1)
        still = [a for a in _apps() if _belongs(int(a["pid"]), svc, invocation)]
        after = _gpu_used()
        report["freed_mib"] = {i: before[i] - after.get(i, 0) for i in before if before[i] != after.get(i, 0)}
        report["apps_after"] = len(_apps())
        report["seconds"] = round(time.time() - t0, 1)
        if still:
            report["failures"].append("GPU memory still held by %s" % ", ".join(
                "pid %s (%s MiB)" % (a["pid"], a["used_memory"]) for a in still))
        out.append(report)
    return {"services": out, "gpus": _gpu_used()}


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def start(req):
    """Start services again; answer with how the current release says to verify them."""
    for name in req["services"]:
        _run(["systemctl", "start", name], "start " + name)
    current = next((m for m in _manifests() if m["stamp"] == _current()), None)
    return {"started": req["services"], "verify": current.get("verify") if current else None}


def main(request_json):
    req = json.loads(request_json)
    _die_with_connection()
    modes = {"probe": probe, "apply": apply, "verify": verify, "peek": peek, "unlock": unlock, "stop": stop,
             "start": start, "release_record": release_record, "releases": releases, "undo": undo,
             "rollback": rollback}
    try:
        result = modes[req["mode"]](req)
    except ActionError as e:
        result = {"ok": False, "error": str(e)}
    finally:
        if req.get("unlock"):  # the last call of a run gives the lock back in the same round trip
            unlock({"token": req["unlock"]})
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
