"""Apply and check batches.

Apply stages and validates every write it can, then runs every check (preflight), and
only then changes anything, in order: a bad file or a refused check leaves the host as
it was.  Check mode runs the checks alone.
"""
import base64
import json
import os

from specops import protocol
from specops.agent.converge import bytecode, checks, installs, upstream
from specops.agent import safefs, weights
from specops.agent.services import units
from specops.agent.host import ActionError, clean, ids, on_interrupt, run_owned, run_streamed, say, sha256
from specops.agent.safefs import StageDir, UnsafePath
from specops.layout import APPLY_JOURNAL, BYTECODE_LINE, UNIT_ONLY


class Staged:
    """A file's new content written beside its target (safefs.StageDir), not yet in place."""

    def __init__(self, action, allowed=()):
        self.action = action
        try:
            self.stage = StageDir(action.path, allowed)
        except UnsafePath as e:
            raise refusal(action, str(e))
        self.path = self.stage.path  # what a validator is given
        self.bytecode = None  # (sha256 of the content, [(name, .pyc)]) its validator compiled
        self.forget = on_interrupt(self.discard)

    def write(self, validate=True):
        a = self.action
        try:
            self.data = base64.b64decode(a.data)
            self.stage.write(self.data, int(a.mode or "0644", 8), *ids(a.owner, a.group))
        except OSError as e:
            self.discard()
            raise refusal(a, "cannot write %s: %s" % (a.path, e.strerror))
        except ActionError as e:
            self.discard()
            raise refusal(a, str(e))
        if a.bytecode:  # the controller compiled it for this interpreter (protocol.Write.bytecode)
            self.take_bytecode((sha256(self.data).hexdigest(), a.bytecode[0], base64.b64decode(a.bytecode[1])))
        if validate and a.validate:
            validate_together([self])
        return self

    def commit(self):
        try:
            if self.action.backup:
                self.stage.copy_current(self.action.backup)
            self.stage.commit()
        except (OSError, ActionError):
            self.discard()
            raise
        self.forget()

    def discard(self):
        try:
            self.stage.remove()
        finally:
            self.forget()

    def take_bytecode(self, compiled):
        """Keep what the validator compiled from this file (bytecode.compiled), if it compiled
        what was staged: other content means the path it read was not ours, and is refused."""
        if compiled is None:
            return
        digest, name, pyc = compiled
        if digest != sha256(self.data).hexdigest():
            raise refusal(self.action, "the validator of %s read other content than was staged "
                                       "(a path swapped under it?)" % self.action.path)
        module = os.path.basename(self.action.path)[:-3]
        if name and bytecode.usable(name, module, pyc):
            self.bytecode = (digest, [(name, pyc)])


def validate_together(staged):
    """Run the validator of staged files that share one (a {}... validator takes them all at once);
    on a refusal, discard them all and say which file was refused and why."""
    a = staged[0].action
    many = a.validate[-1] == "{}..."
    argv = a.validate[:-1] + [s.path for s in staged] if many else [w.replace("{}", staged[0].path) for w in a.validate]
    rc, out, err = run_owned(argv)
    if rc != 0 and UNIT_ONLY in argv and UNIT_ONLY.split("=")[0] in err and "option" in err:
        argv = [w for w in argv if w != UNIT_ONLY]  # an older systemd-analyze (layout.UNIT_ONLY)
        rc, out, err = run_owned(argv)
    if rc == 0:
        compiled = bytecode.compiled(out)
        try:
            for s in staged:
                s.take_bytecode(compiled.get(s.path))
        except ActionError:
            for s in staged:
                s.discard()
            raise
        return
    out = "".join(line for line in out.splitlines(True) if not line.startswith(BYTECODE_LINE)) + err
    named = [s for s in staged if s.path in out]
    refused = min(named, key=lambda s: out.index(s.path)) if named else staged[0]
    for s in staged:
        out = out.replace(s.path + ": ", "").replace(s.path, s.action.path)
        s.discard()
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    raise refusal(refused.action, "%s refused %s: %s" % (
        a.validator or argv[0], refused.action.label or refused.action.path,
        clean(" | ".join(lines[-3:]))[-800:] or "exit %d" % rc))


def _stacks():
    from specops.agent.converge import stacks  # only a stack's build: it imports shutil and tempfile
    return stacks


def refusal(action, message):
    """An ActionError that knows which action it refuses."""
    error = ActionError(message)
    error.action = action
    return error


DO = {
    protocol.Mkdir: lambda a, allowed: safefs.make_dir(a.path, int(a.mode or "0755", 8), *ids(a.owner, a.group),
                                                       allowed=allowed),
    protocol.Attrs: lambda a, allowed: safefs.set_attrs(a.path, int(a.mode, 8) if a.mode else None,
                                                        *ids(a.owner, a.group), allowed=allowed),
    protocol.Remove: lambda a, allowed: safefs.remove(a.path, a.backup, allowed),
    protocol.Run: lambda a, allowed: run_streamed(a.cmd, a.desc or "command"),
    protocol.PipInstall: installs.install,
    protocol.DaemonReload: lambda a, allowed: units.daemon_reload(a.units),
    protocol.Restart: lambda a, allowed: units.restart(a.unit, a.others),
    protocol.StartUnit: lambda a, allowed: units.start_unit(a.unit, a.others),
    protocol.Preflight: lambda a, allowed: checks.preflight(a),
    protocol.Expect: lambda a, allowed: checks.expect(a),
    protocol.BuildStack: lambda a, allowed: _stacks().build(a, allowed),
    protocol.KeepUpstream: lambda a, allowed: upstream.keep(a, allowed),
    protocol.FetchWeights: weights.fetch,
    protocol.RecordWeights: weights.record,
}


def apply(req):
    """Answer a protocol.Apply with a protocol.ApplyResult."""
    actions, staged, results = req.actions, {}, []
    prepared = {}  # path → the bytecode its validator compiled, for the purge that follows its write
    try:  # stage and validate everything before touching anything
        for i, a in enumerate(actions):
            if isinstance(a, protocol.Write) and os.path.isdir(os.path.dirname(a.path)):
                staged[i] = Staged(a, req.allow_shared_dirs).write(validate=False)
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
    changes = [i for i, a in enumerate(actions) if a.KIND not in protocol.CHECK_KINDS]
    journal = Journal([actions[i].desc or actions[i].KIND for i in changes])
    for n, i in enumerate(order + changes):
        a = actions[i]
        say("  [%d/%d] %s" % (n + 1, len(actions), a.desc or a.KIND))
        try:
            if i == (changes or [None])[0]:
                journal.begin()
            if isinstance(a, protocol.Write):
                s = staged.pop(i) if i in staged else Staged(a, req.allow_shared_dirs).write()
                s.commit()
                prepared[a.path], out = s.bytecode, None
            elif isinstance(a, protocol.Purge):
                out = bytecode.purge(a, req.allow_shared_dirs, prepared.pop(a.path, None))
            else:
                out = DO[type(a)](a, req.allow_shared_dirs)
            results.append({"index": i, "out": out})
            if i in changes:
                journal.done_one()
        except Exception as e:  # whatever failed, nothing stays staged
            for s in staged.values():
                s.discard()
            journal.end()
            msg = str(e) if isinstance(e, ActionError) else "%s: %s" % (a.desc or a.KIND, e)
            return protocol.ApplyResult(ok=False, failed=i, error=msg, results=results)
    journal.end()
    return protocol.ApplyResult(ok=True, results=results)


class Journal:
    """A batch's progress while it changes things: kept on disk only if the batch is cut off (a
    lost connection, a kill), so the next run can say what was done and what was not."""

    def __init__(self, steps):
        self.done, self.not_done = [], list(steps)
        from specops.agent.lock import _read
        self.task = (_read() or {}).get("task", "?")

    def _write(self):
        tmp = APPLY_JOURNAL + ".tmp"
        os.makedirs(os.path.dirname(APPLY_JOURNAL), mode=0o700, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(json.dumps({"task": self.task, "done": self.done, "not_done": self.not_done}))
        os.rename(tmp, APPLY_JOURNAL)

    def begin(self):
        self._write()

    def done_one(self):
        self.done.append(self.not_done.pop(0))
        self._write()

    def end(self):
        try:
            os.unlink(APPLY_JOURNAL)
        except OSError:
            pass


def check(req):
    """Answer a protocol.Check: the read-only checks, for real; anything else is refused."""
    results = []
    for i, a in enumerate(req.actions):
        if a.KIND not in protocol.CHECK_KINDS:
            raise ActionError("check mode runs only %s, not %r" % (", ".join(protocol.CHECK_KINDS), a.KIND))
        try:
            results.append({"index": i, "out": DO[type(a)](a, ())})
        except ActionError as e:
            return protocol.ApplyResult(ok=False, failed=i, error=str(e), results=results)
    return protocol.ApplyResult(ok=True, results=results)
