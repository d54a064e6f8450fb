"""Apply and check batches.

Apply stages and validates every write, runs every check (preflight), then the preparations
(protocol.PREPARE: installs, builds, fetches, each beside what serves), and only then the switch
(protocol.SWITCH: renames, enable, reload, restarts), journaled: a bad file, a refused check or a
failed preparation leaves what serves as it was.  Check mode runs the checks alone.
"""
import base64
import json
import os

from specops import protocol
from specops.agent.converge import bytecode, checks, installs, upstream
from specops.agent import faults
from specops.agent import safefs, weights
from specops.agent.services import units
from specops.agent.host import ActionError, clean, ids, on_interrupt, run_owned, run_streamed, say, sha256
from specops.agent.safefs import UnsafePath
from specops.agent.stagedir import StageDir
from specops.layout import APPLY_JOURNAL, BYTECODE_LINE, UNIT_ONLY


class Staged:
    """A file's new content written beside its target (stagedir.StageDir), not yet in place."""

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
    protocol.AptInstall: installs.apt_install,
    protocol.DpkgInstall: installs.dpkg_install,
    protocol.Enable: lambda a, allowed: units.enable(a),
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


class Batch:
    """One apply: its writes staged, then its phases in order (protocol.PHASES)."""

    def __init__(self, req):
        self.req, self.actions, self.allowed = req, req.actions, req.allow_shared_dirs
        self.staged, self.prepared, self.results = {}, {}, []
        self.n = 0  # actions begun, for the progress lines

    def phase(self, name):
        return [i for i, a in enumerate(self.actions) if a.PHASE == name]

    def stage(self, every=False):
        """Stage every write whose directory is there (`every`: every write left, whose directory
        the preparations made), then validate them (a validator that takes several files runs
        once for them all)."""
        fresh = []
        for i, a in enumerate(self.actions):
            if not isinstance(a, protocol.Write) or i in self.staged:
                continue
            if every or os.path.isdir(os.path.dirname(a.path)):
                self.staged[i] = Staged(a, self.allowed).write(validate=False)
                fresh.append(self.staged[i])
        groups = {}
        for s in fresh:
            if s.action.validate:
                many = s.action.validate[-1] == "{}..."
                groups.setdefault(tuple(s.action.validate) if many else id(s), []).append(s)
        for group in groups.values():
            validate_together(group)

    def do(self, i):
        """Run action i (a staged write is renamed into place)."""
        a = self.actions[i]
        self.n += 1
        say("  [%d/%d] %s" % (self.n, len(self.actions), a.desc or a.KIND))
        faults.at(a.KIND)
        if isinstance(a, protocol.Write):  # staged before the switch: an unstaged one would be a bug
            s = self.staged.pop(i)
            s.commit()
            self.prepared[a.path], out = s.bytecode, None
        elif isinstance(a, protocol.Purge):
            out = bytecode.purge(a, self.allowed, self.prepared.pop(a.path, None))
        else:
            out = DO[type(a)](a, self.allowed)
        faults.after(a.KIND)
        self.results.append({"index": i, "out": out})

    def failed(self, i, phase, e):
        for s in list(self.staged.values()):  # whatever failed, nothing stays staged
            s.discard()
        a = self.actions[i] if i is not None else None
        msg = str(e) if isinstance(e, ActionError) or a is None else "%s: %s" % (a.desc or a.KIND, e)
        return protocol.ApplyResult(ok=False, failed=i, phase=phase, error=msg, results=self.results)


def apply(req):
    """Answer a protocol.Apply with a protocol.ApplyResult, phase by phase: every write staged and
    validated and every check run, then the preparations (installs, builds, fetches), then the
    switch (renames, enable, reload, restarts), journaled.  A failure before the switch leaves
    everything that serves as it was."""
    batch, phase, i = Batch(req), protocol.CHECK, None
    try:
        batch.stage()  # a bad file refuses the batch before anything runs
        for i in batch.phase(protocol.CHECK) + batch.phase(protocol.PREPARE):
            phase = batch.actions[i].PHASE
            batch.do(i)
        i, phase = None, protocol.PREPARE
        batch.stage(every=True)  # what a preparation made room for: a built stack's files, a new directory
    except Exception as e:
        if i is None:  # a file refused while staged: the action it belongs to
            i = next((n for n, a in enumerate(batch.actions) if a is getattr(e, "action", None)), 0)
        return batch.failed(i, phase, e)
    switch = batch.phase(protocol.SWITCH)
    journal = Journal(req, [batch.actions[i] for i in switch])
    for n, i in enumerate(switch):
        try:
            journal.begin(n)
            batch.do(i)
        except Exception as e:
            try:
                journal.failed()  # kept: the controller's Undo consumes it, or else the next run
            except OSError:
                pass  # the journal as last written stays, naming the step begun
            return batch.failed(i, protocol.SWITCH, e)
    journal.end()
    return protocol.ApplyResult(ok=True, results=batch.results)


def journal_step(a):
    """What undoing a switch action needs to know of it (never a write's content)."""
    step = {"kind": a.KIND, "desc": a.desc or a.KIND}
    if isinstance(a, (protocol.Write, protocol.Remove)):
        step.update(path=a.path, backup=bool(a.backup))
    elif isinstance(a, protocol.Enable):
        step.update(unit=a.unit, enable=a.enable, now=a.now, was=a.was)
    return step


class Journal:
    """A switch's progress while it changes things, on disk until it ends well: a switch cut off
    (a lost connection, a kill) or failed leaves it, so that the controller's undo, or else the
    next run that takes the lock, undoes what it began (rollback.cut_off), and a status says it
    meanwhile.  Root's alone, in specops's own directory; written whole (a new file, renamed)."""

    def __init__(self, req, steps):
        from specops.agent.lock import _read
        self.doc = {"task": (_read() or {}).get("task", "?"), "stamp": req.stamp,
                    "services": [protocol.encode(r) for r in req.services], "running": req.running,
                    "concerned": req.concerned, "allow_shared_dirs": req.allow_shared_dirs,
                    "steps": [journal_step(a) for a in steps], "begun": -1, "failed": False}

    def begin(self, n):
        """Step n is about to run: it may be done whatever happens next."""
        self.doc["begun"] = n
        self._write()

    def failed(self):
        self.doc["failed"] = True
        self._write()

    def _write(self):
        os.makedirs(os.path.dirname(APPLY_JOURNAL), mode=0o700, exist_ok=True)
        tmp = "%s.%s.tmp" % (APPLY_JOURNAL, os.urandom(6).hex())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.doc))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, APPLY_JOURNAL)

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
