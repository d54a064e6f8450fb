"""Apply and check batches.

Apply stages and validates every write it can, then runs every check (preflight), and
only then changes anything, in order: a bad file or a refused check leaves the host as
it was.  Check mode runs the checks alone.
"""
import base64
import json
import os
import shutil
import subprocess
import time

from specops import protocol
from specops.agent import units
from specops.agent.host import ActionError, clean, ids, on_interrupt, run_streamed, say, update_state
from specops.layout import STAGE_DIR, is_bytecode_of


class Staged:
    """A file's new content written beside its target and validated, not yet in place."""

    def __init__(self, action):
        self.action = action
        self.path = os.path.join(os.path.dirname(action.path), STAGE_DIR, os.path.basename(action.path))
        self.forget = on_interrupt(self.discard)

    def write(self, validate=True):
        a = self.action
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        data = base64.b64decode(a.data)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
                os.fchmod(fd, int(a.mode or "0644", 8))
                os.fchown(fd, *ids(a.owner, a.group))
            finally:
                os.close(fd)
        except OSError as e:
            self.discard()
            raise refusal(a, "cannot write %s: %s" % (a.path, e.strerror))
        if validate and a.validate:
            validate_together([self])
        return self

    def commit(self):
        a = self.action
        backup(a.path, a.backup)
        os.rename(self.path, a.path)
        self.forget()
        dfd = os.open(os.path.dirname(a.path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._remove_dir()

    def discard(self):
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self.forget()
        self._remove_dir()

    def _remove_dir(self):
        try:
            os.rmdir(os.path.dirname(self.path))  # only when empty: another file may be staged there
        except OSError:
            pass


def validate_together(staged):
    """Run the validator of staged files that share one (a {}... validator takes them all at once);
    on a refusal, discard them all and say which file was refused and why."""
    a = staged[0].action
    many = a.validate[-1] == "{}..."
    argv = a.validate[:-1] + [s.path for s in staged] if many else [w.replace("{}", staged[0].path) for w in a.validate]
    res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if res.returncode == 0:
        return
    out = res.stdout
    named = [s for s in staged if s.path in out]
    refused = min(named, key=lambda s: out.index(s.path)) if named else staged[0]
    for s in staged:
        out = out.replace(s.path + ": ", "").replace(s.path, s.action.path)
        s.discard()
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    raise refusal(refused.action, "%s refused %s: %s" % (
        a.validator or argv[0], refused.action.label or refused.action.path,
        clean(" | ".join(lines[-3:]))[-800:] or "exit %d" % res.returncode))


def refusal(action, message):
    """An ActionError that knows which action it refuses."""
    error = ActionError(message)
    error.action = action
    return error


def backup(path, to):
    if to and os.path.lexists(path):
        os.makedirs(os.path.dirname(to), mode=0o700, exist_ok=True)
        shutil.copy2(path, to)


def purge(a):
    """Remove every cached bytecode of a module, check none is left, record when."""
    d, base = os.path.split(a.path)
    mod, cache = base[:-3], os.path.join(d, "__pycache__")
    removed = []
    if os.path.isdir(cache):
        for n in os.listdir(cache):
            if is_bytecode_of(n, mod):
                os.unlink(os.path.join(cache, n))
                removed.append(n)
        left = [n for n in os.listdir(cache) if is_bytecode_of(n, mod)]
        if left:
            raise ActionError("bytecode for %s still present after purge: %s" % (a.path, left))

    def note(state):
        state.setdefault("purges", {})[a.path] = {"sha256": a.sha256, "purged_at": time.time(), "removed": removed}
    update_state(note)
    return removed


def _compare_expect(got, expect, what):
    diffs = ["%s: intended %s, effective %s" % (k, v, got.get(k)) for k, v in sorted(expect.items())
             if got.get(k) != v]
    if diffs:
        raise ActionError("%s: %s" % (what, "; ".join(diffs)))
    return got


def preflight(a):
    """The installed SGLang's own resolver, on these exact arguments, before anything restarts."""
    if not os.path.exists(a.python):
        raise ActionError("host preflight for %s cannot run: %s does not exist" % (a.service, a.python))
    res = subprocess.run([a.python, "-c", a.script], input=json.dumps([a.argv]), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    if res.returncode != 0:
        raise ActionError("host preflight could not run SGLang's resolver in %s: %s"
                          % (a.python, clean(res.stderr.strip()[-500:])))
    result = json.loads(res.stdout)[0]
    if not result["ok"]:
        raise ActionError("host preflight: the installed SGLang refuses these arguments: %s" % result["error"])
    return _compare_expect(result["values"], a.expect, "host preflight (the installed SGLang's own resolver) "
                                                       "refuses %s" % a.service)


def expect(a):
    """Run code with an interpreter; its JSON answer must hold the expected values."""
    res = subprocess.run([a.python, "-c", a.code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    if res.returncode != 0:
        lines = [l for l in res.stderr.strip().splitlines() if l.strip()]
        raise ActionError("%s: %s" % (a.what, clean(" | ".join(lines[-2:])) or "exit %d" % res.returncode))
    return _compare_expect(json.loads(res.stdout), a.expect, a.what)


def _mkdir(a):
    os.makedirs(a.path, exist_ok=True)
    os.chmod(a.path, int(a.mode or "0755", 8))
    os.chown(a.path, *ids(a.owner, a.group))


def _attrs(a):
    if a.mode:
        os.chmod(a.path, int(a.mode, 8))
    os.chown(a.path, *ids(a.owner, a.group))


def _remove(a):
    backup(a.path, a.backup)
    if os.path.isdir(a.path) and not os.path.islink(a.path):
        shutil.rmtree(a.path)
    elif os.path.lexists(a.path):
        os.unlink(a.path)


DO = {
    protocol.Mkdir: _mkdir,
    protocol.Attrs: _attrs,
    protocol.Remove: _remove,
    protocol.Purge: purge,
    protocol.Run: lambda a: run_streamed(a.cmd, a.desc or "command"),
    protocol.DaemonReload: lambda a: run_streamed(["systemctl", "daemon-reload"], "daemon-reload"),
    protocol.Restart: lambda a: units.restart(a.unit, a.others),
    protocol.Preflight: preflight,
    protocol.Expect: expect,
}


def apply(req):
    """Answer a protocol.Apply with a protocol.ApplyResult."""
    actions, staged, results = req.actions, {}, []
    try:  # stage and validate everything before touching anything
        for i, a in enumerate(actions):
            if isinstance(a, protocol.Write) and os.path.isdir(os.path.dirname(a.path)):
                staged[i] = Staged(a).write(validate=False)
        groups = {}
        for i, s in staged.items():
            if s.action.validate:
                many = s.action.validate[-1] == "{}..."
                groups.setdefault(tuple(s.action.validate) if many else i, []).append(s)
        for group in groups.values():
            validate_together(group)
    except ActionError as e:
        for s in staged.values():
            s.discard()
        failed = next((i for i, a in enumerate(actions) if a is getattr(e, "action", None)), 0)
        return protocol.ApplyResult(ok=False, failed=failed, error=str(e))
    # Checks ask "will this work?" of the host: they run before anything is changed.
    order = [i for i, a in enumerate(actions) if a.KIND in protocol.CHECK_KINDS]
    order += [i for i, a in enumerate(actions) if a.KIND not in protocol.CHECK_KINDS]
    for n, i in enumerate(order):
        a = actions[i]
        say("  [%d/%d] %s" % (n + 1, len(actions), a.desc or a.KIND))
        try:
            if isinstance(a, protocol.Write):
                (staged.pop(i) if i in staged else Staged(a).write()).commit()
                out = None
            else:
                out = DO[type(a)](a)
            results.append({"index": i, "out": out})
        except (ActionError, OSError, KeyError) as e:
            for s in staged.values():
                s.discard()
            msg = str(e) if isinstance(e, ActionError) else "%s: %s" % (a.desc or a.KIND, e)
            return protocol.ApplyResult(ok=False, failed=i, error=msg, results=results)
    return protocol.ApplyResult(ok=True, results=results)


def check(req):
    """Answer a protocol.Check: the read-only checks, for real; anything else is refused."""
    results = []
    for i, a in enumerate(req.actions):
        if a.KIND not in protocol.CHECK_KINDS:
            raise ActionError("check mode runs only %s, not %r" % (", ".join(protocol.CHECK_KINDS), a.KIND))
        try:
            results.append({"index": i, "out": DO[type(a)](a)})
        except ActionError as e:
            return protocol.ApplyResult(ok=False, failed=i, error=str(e), results=results)
    return protocol.ApplyResult(ok=True, results=results)
