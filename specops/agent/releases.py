"""Releases on the host: RELEASES/<stamp>/{manifest.json, files/, previous/} and `current`.

`files/` is a snapshot of every managed file as a release deployed it, `previous/` what
that deploy replaced; the manifest also names the release's stack and weights.  Recording one,
listing them, their spec-bench figures, pruning (releases, then the stacks none names), and
starting the current one's services.  Putting one back is rollback.py.
"""
import os
import stat
import time

from specops import protocol
from specops.agent.services import units
from specops.agent.host import ActionError, group_name, sha256_file, user_name
from specops.agent.converge.venvs import resolve_key
from specops.agent.converge import stacks
from specops.agent.lean import load
from specops.agent.safefs import UnsafePath, copy_out
from specops.layout import RELEASES, RELEASES_KEPT


def manifests():
    """Every release's manifest, oldest first (unreadable ones skipped)."""
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
                out.append(load(f))
        except (OSError, ValueError):
            continue
    return out


def current():
    """The stamp `current` points at, or None before the first release."""
    try:
        return os.readlink(os.path.join(RELEASES, "current"))
    except OSError:
        return None


def current_manifest():
    """The manifest of the current release, or None."""
    stamp = current()
    return next((m for m in manifests() if m["stamp"] == stamp), None)


def _set_current(stamp):
    """Point `current` at a release, atomically (a new link renamed over the old one)."""
    link = os.path.join(RELEASES, "current")
    tmp = link + ".tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(stamp, tmp)
    os.rename(tmp, link)


def _snapshot_fact(path):
    """sha256 and mode of a file in the release (copied from the managed file with its mode)."""
    st = os.lstat(path)
    return {"sha256": sha256_file(path), "mode": "%04o" % stat.S_IMODE(st.st_mode),
            "owner": user_name(st.st_uid), "group": group_name(st.st_gid)}


def record(req):
    """Answer a protocol.ReleaseRecord: snapshot, manifest, and `current` for a deployed release."""
    d = os.path.join(RELEASES, req.stamp)
    os.makedirs(os.path.join(d, "files"), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(d), 0o700)
    files = {}
    for key in req.managed:
        path = resolve_key(key)
        dest = os.path.join(d, "files", path.lstrip("/")) if path else None
        try:
            if path and copy_out(path, dest):
                files[path] = _snapshot_fact(dest)
        except (UnsafePath, OSError):
            continue  # not a regular file we can read safely: nothing to snapshot
    previous = {}
    for path, how in req.previous.items():
        kept = os.path.join(d, "previous", path.lstrip("/"))
        previous[path] = _snapshot_fact(kept) if how == "backup" and os.path.exists(kept) else None
    manifest = dict(req.manifest, stamp=req.stamp, status=req.status, files=files, previous=previous,
                    recorded_at=time.time())
    if req.provenance:  # who deployed it: what is not known left out
        manifest["provenance"] = {k: v for k, v in protocol.to_dict(req.provenance).items() if v is not None}
    _write_manifest(manifest)
    if req.status == "deployed":
        _set_current(req.stamp)
    _prune()
    return protocol.RecordResult(stamp=req.stamp, files=len(files))


def _write_manifest(manifest):
    """A release's manifest.json, whole or not at all: pruning reads which stacks it names."""
    path = os.path.join(RELEASES, manifest["stamp"], "manifest.json")
    with open(path + ".tmp", "w") as f:
        import json  # a write: json's encoder, which indents
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def mark_rolled_back(left, to):
    """After a rollback to release `to`: the releases it left (`left`: their manifests) say so,
    and `to`, current again, no longer does.  The status stays "deployed": a later rollback
    still reads what each replaced, and may go back to one."""
    for m in left:
        if not m.get("rolled_back"):
            _write_manifest(dict(m, rolled_back={"to": to["stamp"], "at": time.time()}))
    if to.get("rolled_back"):
        _write_manifest({k: v for k, v in to.items() if k != "rolled_back"})


def _prune():
    """Keep the newest RELEASES_KEPT deployed releases (what rollback goes back to), the current one
    and the deployed one before it, and apart from them the newest RELEASES_KEPT attempts that were
    undone (failed attempts never push out what a rollback needs); then the stacks those name: a
    stack goes only when none does."""
    now = current()
    names = sorted(n for n in os.listdir(RELEASES) if n != "current" and not n.endswith(".tmp"))
    deployed = [m["stamp"] for m in manifests() if m.get("status") == "deployed"]
    before = [s for s in deployed if now and s < now][-1:]
    attempts = [n for n in names if n not in deployed]
    for n in deployed[:-RELEASES_KEPT] + attempts[:-RELEASES_KEPT]:
        if n != now and n not in before:
            import shutil  # only to prune: status and a no-op never do
            shutil.rmtree(os.path.join(RELEASES, n), ignore_errors=True)
    left = manifests()
    kept = {m.get("venv") for m in left}
    # A release whose manifest cannot be read might name any stack: then none is removed.
    readable = len(left) == len([n for n in os.listdir(RELEASES) if n != "current" and not n.endswith(".tmp")])
    if readable and kept - {None}:  # hosts with releases from before stacks name none: their venv is the user's
        stacks.prune(kept)


def uses():
    """stack path → the stamps of the releases that run it."""
    out = {}
    for m in manifests():
        if m.get("venv"):
            out.setdefault(m["venv"], []).append(m["stamp"])
    return out


def releases(req):
    """Answer a protocol.Releases (with each release's perf.json, when spec-bench measured it)."""
    now = current()
    kept, cache = stacks.stacks(uses())
    return protocol.ReleasesResult(
        current=now,
        releases=[
            {
                "stamp": m["stamp"],
                "status": m.get("status"),
                "services": m.get("services", []),
                "files": {p: f.get("sha256") for p, f in m.get("files", {}).items()},
                "current": m["stamp"] == now,
                "rolled_back": _rolled_back(m, now),
                "summary": m.get("summary", ""),
                "verify": m.get("verify", []),
                "verified": m.get("verified", []),
                "perf": _figures(read_perf(m["stamp"])),
                "tune": _figures(read_perf(m["stamp"], "tune"), ("baseline",)),
                "spec": m.get("spec", {}),
                "packages": m.get("packages", {}),
                "venv": m.get("venv"),
                "weights": m.get("weights", {}),
                "provenance": m.get("provenance"),
            }
            for m in manifests()
        ],
        stacks=kept,
        uv_cache=cache,
    )


def _rolled_back(m, now):
    """Its rollback mark; one recorded before rollbacks marked what they left is known by being
    deployed and newer than current (a deploy always becomes current)."""
    if m["stamp"] == now:
        return None
    if m.get("rolled_back"):
        return m["rolled_back"]
    return {"to": now} if m.get("status") == "deployed" and now and m["stamp"] > now else None


def _raw_out(side):
    return [{k: v for k, v in lv.items() if k != "raw"} if isinstance(lv, dict) else lv
            for lv in side] if isinstance(side, list) else side


def _figures(perf, sides=("spec", "baseline")):
    """perf.json (or tune.json) without the raw per-request timings (they stay in the file): what
    listings need.  A tune's candidates each hold levels of their own."""
    if not perf:
        return perf
    # A record of another shape is left to the controller to refuse: the listing must not fail on it.
    out = {}
    for name, r in perf.items():
        if isinstance(r, dict):
            r = dict(r, **{side: _raw_out(r.get(side) or []) for side in sides})
            if isinstance(r.get("candidates"), list):
                r["candidates"] = [dict(c, levels=_raw_out(c.get("levels") or [])) if isinstance(c, dict) else c
                                   for c in r["candidates"]]
        out[name] = r
    return out


def read_perf(stamp, kind="perf"):
    """A release's perf.json (or tune.json): service name → that service's latest record."""
    try:
        with open(os.path.join(RELEASES, stamp, kind + ".json")) as f:
            perf = load(f)
    except (OSError, ValueError):
        return None
    if isinstance(perf, dict) and "service" in perf:  # written before perf.json held several services
        perf = {perf["service"]: perf}
    return perf if isinstance(perf, dict) else None


def record_perf(req):
    """Answer a protocol.PerfRecord: the service's result in the release's perf.json, beside the
    other services' (the file written whole, then renamed; the host lock is held)."""
    stamp = req.stamp or current()
    if not stamp or not os.path.isfile(os.path.join(RELEASES, stamp, "manifest.json")):
        raise ActionError("no release %s to keep the result in (deploy first)" % (stamp or "yet"))
    if req.record not in ("perf", "tune"):
        raise ActionError("no record of kind %r" % req.record)
    path = os.path.join(RELEASES, stamp, req.record + ".json")
    perf = dict(read_perf(stamp, req.record) or {}, **{req.perf["service"]: req.perf})
    with open(path + ".tmp", "w") as f:
        import json
        json.dump(perf, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    return protocol.RecordResult(stamp=stamp, files=1)


def start(req):
    """Answer a protocol.Start; the controller then verifies as the current release says."""
    names = [r.name for r in req.services]
    for ref in req.services:
        units.start_unit(ref, [n for n in names if n != ref.name])
    manifest = current_manifest()
    return protocol.StartResult(started=[r.name for r in req.services],
                                verify=manifest.get("verify") if manifest else None)
