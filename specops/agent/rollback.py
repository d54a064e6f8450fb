"""Putting a release back on the host: undo of a failed deploy (its own backups), of a switch an
earlier run was cut off in (its journal), rollback to an older release (its snapshot and the later
releases' backups), and the restart after each.
Rollback points the unit back at the release's stack; it never installs anything."""
import base64
import json
import re
import os
import stat

from specops import protocol
from specops.agent.converge.bytecode import purge
from specops.agent.converge.stage import Staged
from specops.agent.stagedir import sweep
from specops.agent.host import ActionError, sha256
from specops.agent.releases import _set_current, current, current_manifest, manifests, mark_rolled_back, record
from specops.agent.safefs import UnsafePath, read_file, remove
from specops.agent.services import units
from specops.agent.weights import read_manifest
from specops.unitwords import interpreter
from specops.layout import APPLY_JOURNAL, RELEASES, UNIT_DIR, unit_path


def _state_at(target, deployed):
    """path → content source (or None: absent) that puts the host back to release `target`."""
    later = sorted((m for m in deployed if m["stamp"] > target["stamp"]), key=lambda m: m["stamp"])
    want = {}
    for m in later:  # earliest first: the content a path had before it was first changed after target
        for path, prev in m.get("previous", {}).items():
            if path not in target["files"] and path not in want:
                want[path] = os.path.join(RELEASES, m["stamp"], "previous", path.lstrip("/")) if prev else None
    for path in target["files"]:
        want[path] = os.path.join(RELEASES, target["stamp"], "files", path.lstrip("/"))
    return want


def _current_sha(path, allowed):
    try:
        data = read_file(path, allowed)
    except UnsafePath:
        return "unsafe"
    return None if data is None else sha256(data).hexdigest()


def _restore(want, allowed=()):
    """Put files back atomically (root-owned, as specops writes everything); purge bytecode of
    restored modules.  Every file is staged beside its target first: one that cannot be (a full
    disk, a path made unsafe) fails the restore before any is renamed.  Returns what changed."""
    pending, removed, restored = [], [], {}  # pending: staged, not renamed into place yet
    try:
        for path, src in sorted(want.items()):
            if src is None:
                if _current_sha(path, allowed) is not None:
                    removed.append(path)
                continue
            with open(src, "rb") as f:
                data = f.read()
            digest = sha256(data).hexdigest()
            if _current_sha(path, allowed) == digest:
                continue
            mode = "%04o" % stat.S_IMODE(os.lstat(src).st_mode)
            pending.append(Staged(protocol.Write(path=path, data=base64.b64encode(data).decode(), mode=mode),
                                  allowed).write())
            restored[path] = digest
        while pending:
            pending.pop(0).commit()  # a commit that fails discards its own stage
    except BaseException:
        for s in pending:
            s.discard()
        raise
    for path in removed:
        remove(path, None, allowed)
    for path, digest in restored.items():
        if path.endswith(".py"):
            purge(protocol.Purge(path=path, sha256=digest), allowed)
    return sorted(removed + list(restored))


def _restart(refs, daemon_reload, known=()):
    if daemon_reload:
        units.daemon_reload()
    names = {r.name for r in refs} | {r.name for r in known}
    for ref in refs:
        units.restart(ref, sorted(names - {ref.name}))


def _unit_file(path):
    return path.startswith(UNIT_DIR + "/")


def _refs(names, known):
    """UnitRefs for unit names: as the request describes them, else with the defaults."""
    by_name = {r.name: r for r in known}
    return [by_name.get(n) or protocol.UnitRef(name=n) for n in names]


def put_back(stamp, previous, enabled, services, running=None, concerned=None, restarts=True, allowed=()):
    """Undo an attempt's switch: its files and units' states (files_back), then the restarts."""
    changed, again, reload = files_back(stamp, previous, enabled, services, running, concerned, restarts, allowed)
    _restart(again, reload, services)
    return changed, [r.name for r in again]


def files_back(stamp, previous, enabled, services, running=None, concerned=None, restarts=True, allowed=()):
    """An attempt's switch undone from its own backups (releases/<stamp>/previous): enables
    reverted, files put back (created ones removed; a backup never made means its file was never
    replaced), and of the services it concerns (`concerned`: names; None: every one) those that
    did not run before it (`running`) stopped, as they were.  Returns (the paths changed, the
    services to restart then: those concerned that ran, if the switch changed anything or reached
    a restart (`restarts`), and whether systemd must reload first)."""
    d = os.path.join(RELEASES, stamp)
    want = {}
    for path, how in previous.items():
        kept = os.path.join(d, "previous", path.lstrip("/"))
        if how != "backup" or os.path.lexists(kept):
            want[path] = kept if how == "backup" else None
    for a in reversed(enabled):  # while their unit files are still there
        units.unenable(a)
    # A unit this deploy created goes away: stop it (leftovers accounted) while systemd still
    # knows it, and restart only the units that stay.
    gone = [r for r in services if unit_path(r.name) in want and want[unit_path(r.name)] is None]
    names = [r.name for r in services]
    mine = [r for r in services if r not in gone and (concerned is None or r.name in concerned)]
    touched = restarts or bool(enabled) or bool(want)
    idle = [r for r in mine if touched and running is not None and r.name not in running]  # not running before
    for ref in gone + idle:  # idle: a start of this attempt's (or a restart that failed) is stopped again
        units.stop_unit(ref, [n for n in names if n != ref.name], measure=False)
    changed = _restore(want, allowed)
    again = [r for r in mine if r not in idle] if touched or changed else []
    return changed, again, bool(enabled) or any(_unit_file(p) for p in changed)


def undo(req):
    """Answer a protocol.Undo: this deploy's own backups back in place, created files removed;
    its switch's journal (kept when the switch failed) is then done with."""
    changed, _ = put_back(req.stamp, req.previous, req.enabled, req.services, req.running, req.concerned,
                          req.restarts, req.allow_shared_dirs)
    journal = _journal()
    if journal and journal.get("stamp") == req.stamp:
        os.unlink(APPLY_JOURNAL)
    manifest = current_manifest()
    return protocol.UndoResult(restored=changed, current=current(), verify=manifest.get("verify") if manifest else None)


STAMP = re.compile(r"[0-9]{8}T[0-9]{6}\.[0-9]{6}Z")  # layout.new_stamp's (fullmatch)


def _journal():
    """The switch journal (stage.Journal) as written, or None: only root's own regular file that
    no one else can write, never through a link."""
    try:
        fd = os.open(APPLY_JOURNAL, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return None
        try:
            journal = json.load(f)
        except ValueError:
            return None
    return journal if isinstance(journal, dict) else None


def cut_off(undo_it):
    """The journal of a switch an earlier run was cut off in (or whose undo never came), or None:
    what it had done and not, and with `undo_it` (the run that now holds the lock, before it does
    anything else) that switch undone from its backups, the attempt recorded rolled-back.  An
    undo that fails leaves the journal, and says why (`undone.error`): every run that takes the
    lock tries again."""
    journal = _journal()
    if journal is None:
        return None
    task = str(journal.get("task", "?"))
    if not journal.get("stamp"):  # an older specops's journal: it kept no backups' stamp
        said = {"task": task, "done": journal.get("done") or [], "cut_at": None,
                "not_done": journal.get("not_done") or [], "undone": None}
        if undo_it:
            said["undone"] = {
                "restored": [],
                "restarted": [],
                "note": "an older specops's journal, which says "
                "nothing to undo from: not undone; look at what it names",
            }
            os.unlink(APPLY_JOURNAL)
        return said
    steps, begun = journal.get("steps") or [], journal.get("begun", -1)
    try:
        said = {"task": task, "done": [s["desc"] for s in steps[:max(begun, 0)]],
                "cut_at": steps[begun]["desc"] if 0 <= begun < len(steps) else None,
                "not_done": [s["desc"] for s in steps[begun + 1:]], "undone": None}
    except (KeyError, TypeError, IndexError):
        return {"task": task, "done": [], "cut_at": None, "not_done": [],
                "undone": {"error": "the journal does not read as a switch's"} if undo_it else None}
    if not undo_it:
        return said
    try:
        said["undone"] = _recover(journal, steps[:begun + 1])  # the step begun may have been done
    except Exception as e:  # kept: the next run that takes the lock tries again
        said["undone"] = {"error": str(e) if isinstance(e, ActionError) else "%s: %s" % (type(e).__name__, e)}
    return said


def _recover(journal, begun):
    """Files and units' states back (a failure: the journal stays, for the next run), the journal
    then done with; the restarts and the attempt's record after that, whose failures are said,
    never again a reason to keep every later run off the host."""
    stamp = journal["stamp"]
    if not STAMP.fullmatch(str(stamp)):
        raise ActionError("the journal names no release (%r)" % stamp)
    previous = {}
    for s in begun:
        if s["kind"] in ("write", "remove"):
            path = s["path"]
            if not path.startswith("/") or os.path.normpath(path) != path:
                raise ActionError("the journal names %r, not a plain absolute path" % path)
            previous[path] = "backup" if s["backup"] else "absent"
    enabled = [protocol.Enable(unit=s["unit"], enable=s["enable"], now=s["now"], was=s["was"])
               for s in begun if s["kind"] == "enable"]
    # as they were deployed, but drained as any stop (the run that asked otherwise is gone)
    services = [protocol.replace(protocol.fields_of(protocol.UnitRef, r, "the journal's unit"), quick=None)
                for r in journal.get("services") or []]
    changed, again, reload = files_back(stamp, previous, enabled, services, journal.get("running"),
                                        journal.get("concerned"), any(s["kind"] in protocol.RESTARTING for s in begun),
                                        journal.get("allow_shared_dirs") or ())
    os.unlink(APPLY_JOURNAL)
    for d in sorted({os.path.dirname(s["path"]) for s in journal["steps"] if s["kind"] == "write"}):
        sweep(d, journal.get("allow_shared_dirs") or ())  # what the kill left staged (a secret, say)
    warnings = []
    try:
        _restart(again, reload, services)
    except Exception as e:
        warnings.append("restarting %s failed: %s" % (", ".join(r.name for r in again), e))
    try:
        record(protocol.ReleaseRecord(stamp=stamp, managed=[], previous=previous, status=protocol.ROLLED_BACK,
                                      manifest={"services": [r.name for r in services],
                                                "summary": "cut off during its switch (task %s), at: %s; undone by the "
                                                           "next run" % (journal.get("task", "?"),
                                                                         begun[-1]["desc"] if begun else "its start")}))
    except Exception as e:
        warnings.append("the attempt is not recorded: %s" % e)
    return {"restored": changed, "restarted": [r.name for r in again], "warnings": warnings}


def rollback(req):
    """Answer a protocol.Rollback: back to the release before current (or `to`)."""
    deployed = [m for m in manifests() if m.get("status") == "deployed"]
    now = current()
    if req.to:
        target = next((m for m in deployed if m["stamp"] == req.to), None)
        if target is None:
            # the host knows not how the user chose it, to word `inv releases` for them: it names them
            raise ActionError("no deployed release %s (deployed: %s)"
                              % (req.to, ", ".join(m["stamp"] for m in deployed) or "none"))
    else:
        older = [m for m in deployed if now and m["stamp"] < now]
        if not older:
            raise ActionError("no release before %s to roll back to" % (now or "the first deploy"))
        target = older[-1]
    want = _state_at(target, deployed)
    _runnable(target, want)
    changed = _restore(want, req.allow_shared_dirs)
    _restart(_refs(target.get("services", []), req.services), any(_unit_file(p) for p in changed),
             req.services)
    _set_current(target["stamp"])
    notes = _weights_differ(target)
    try:  # the rollback happened: a listing's mark is not worth failing it for
        mark_rolled_back([m for m in deployed if target["stamp"] < m["stamp"] <= (now or "")], target)
    except OSError as e:
        notes = list(notes) + ["the releases left behind are not marked rolled back: %s" % (e.strerror or e)]
    return protocol.RollbackResult(to=target["stamp"], replaced=now, restored=changed,
                                   verify=target.get("verify", []), notes=notes)


def _runnable(target, want):
    """Refuse, before anything is put back, a release whose units would run an interpreter that is
    no longer on the host (its stack pruned, or a venv of the user's removed)."""
    for path, src in want.items():
        if not (path.endswith(".service") and src):
            continue
        with open(src) as f:
            python = interpreter(f.read()) or ""
        if python.startswith("/") and not os.path.exists(python):
            raise ActionError("release %s runs %s, which is no longer on the host: nothing was changed"
                              % (target["stamp"], python))


def _weights_differ(target):
    """One line per weights directory whose content is not what `target` ran: rollback puts back
    files and stacks, never weights."""
    out = []
    for dest, then in sorted((target.get("weights") or {}).items()):
        now = (read_manifest(dest) or {}).get("digest")
        if then.get("digest") and now != then["digest"]:
            out.append("weights in %s differ from what %s ran (%s then, %s now): rollback does not restore "
                       "weights" % (dest, target["stamp"], (then.get("commit") or then["digest"])[:12],
                                    ((read_manifest(dest) or {}).get("commit") or now or "none")[:12]))
    return out
