"""The converge steps of a host's run: lock and probe, plan every role against the facts (pushing
what the batch needs), then apply the batch (the agent runs its checks, its preparations, then
its switch and handlers) or, in check mode, run the read-only checks.  HostRun (specops/run.py)
inherits them; deploy calls them one by one (flows/pipeline.py), other bodies run.converge()."""
from __future__ import annotations

import time

from . import kinds, protocol
from .errors import ApplyFailed, SpecopsError
from .layout import new_stamp, release_dir
from .ops import Context, Facts, handlers
from .remote import peergrant


class Planned:
    """What a plan makes of every role: the batch's parts, in the order the host gets them."""

    def __init__(self):
        self.checks: list = []     # read-only checks (the preflight)
        self.pending: list = []    # the roles' actions, in their order (the agent orders them by phase)
        self.handlers: list = []   # daemon-reload and restarts, last
        self.planned: list = []    # (record, Change) of each change the batch makes
        self.foreseen: list = []   # what the facts already show would fail (check mode says it)
        self.changed_by = None     # check mode: the REPROBE role whose changes later checks would follow


# what an undo puts back: files (from the release's backups) and units' enablement
UNDOABLE = (protocol.Write, protocol.Remove, protocol.Enable)
WHILE = {protocol.CHECK: "checking", protocol.PREPARE: "preparing, before the switch", protocol.SWITCH: "switching"}


def kept_words(a) -> str | None:
    """A preparation that stays after a failure, as the output and the release record say it
    (None: it only asked, as an import check does, or it goes with the attempt: a new stack)."""
    if isinstance(a, (protocol.Expect, protocol.BuildStack)):  # a check; a stack no kept release names is
        return None                                            # pruned with the attempt's record
    if isinstance(a, protocol.PipInstall):  # the one into a venv something may run from
        return f"{a.desc or a.KIND} (into {a.python.rsplit('/bin/', 1)[0]} in place: its next start imports it)"
    return a.desc or a.KIND


def concerned(actions: list, planned: list | None) -> set[str]:
    """The services a batch's switch concerns (an undo restarts these only): those its changes
    name, and those its handlers restart or reload."""
    names = set()
    for _, c in planned or []:
        if any(a.PHASE == protocol.SWITCH for a in c.actions):
            names |= set(c.services)
    names |= {a.unit.name for a in actions if isinstance(a, (protocol.Restart, protocol.StartUnit))}
    names |= {u[:-len(".service")] for a in actions if isinstance(a, protocol.DaemonReload) for u in a.units
              if u.endswith(".service")}
    return names


class Converging:
    """HostRun's converge steps (it provides host, opts, out, report, plan, call, probe, say)."""

    context: Context | None = None  # the plan's (new_context), once planned
    running: list[str] | None = None  # the services active at its first probe: what an undo starts again
    kept: tuple = ()  # what its preparations did, which no undo takes back (their descriptions)
    restarting = False  # its switch reached a restart, start or reload (an undo restarts what ran)
    applying = False  # an Apply was sent and not answered (a lost connection: its outcome is unknown)
    concerned: frozenset = frozenset()  # the services its switches concern (converging.concerned)

    def push(self, uploads: list[tuple]) -> None:
        """Send files the batch needs, with progress (bytes, rate, ETA); an upload is (local, remote)
        or (local, remote, offset) to resume a cut one."""
        for local, remote, *rest in uploads:
            name, t0, last, offset = remote.rsplit("/", 1)[-1], time.monotonic(), [0.0], (rest or [0])[0]

            def progress(sent, total, name=name, t0=t0, last=last, offset=offset):
                now = time.monotonic()
                if now - last[0] >= 2 or sent == total:
                    last[0] = now
                    rate = (sent - offset) / max(now - t0, 1e-3)
                    self.say(f"push {name}: {sent / 2**20:.1f}/{total / 2**20:.1f} MiB, {rate / 2**20:.1f} MiB/s, "
                             f"ETA {(total - sent) / rate if rate else 0:.0f}s")

            self.report.extra["bytes_pushed"] = (self.report.extra.get("bytes_pushed", 0)
                                                 + self.connect().push(local, remote, progress, offset))

    def apply(self, actions: list, planned: list | None = None) -> None:
        """Run a batch (the agent runs its checks, then its preparations, then its switch);
        `planned`: the (record, Change) pairs it makes, so a failed batch leaves the ones it never
        made out of the recap's changed."""
        if not actions:
            return
        if self.before_change:  # e.g. take this worker out of its router and let it drain
            hook, self.before_change = self.before_change, None
            hook()
        stamp = self.context.release_dir.rsplit("/", 1)[1] if self.context and self.context.release_dir else None
        self.concerned = self.concerned | concerned(actions, planned)
        self.applying = True  # until the host answers: a lost connection leaves its outcome unknown here
        res = self.call(protocol.Apply(actions=actions, stamp=stamp, running=self.running,
                                       services=list(kinds.unit_refs(self.host, self.quick).values()),
                                       concerned=sorted(self.concerned),
                                       allow_shared_dirs=self.host.get("allow_shared_dirs") or []),
                        on_stderr=lambda line: self.say(line.strip()))
        self.applying = False
        done = [actions[r["index"]] for r in res.results]
        begun = actions[res.failed] if not res.ok and res.failed is not None else None
        if begun is not None and res.phase == protocol.SWITCH:  # the step that failed may have begun its change
            done.append(begun)
        self.acted = self.acted or bool(done)
        self.applied += [a for a in done if isinstance(a, UNDOABLE)]
        self.restarting = self.restarting or any(a.KIND in protocol.RESTARTING for a in done)
        self.kept = (*self.kept, *(kept_words(a) for a in done if a.PHASE == protocol.PREPARE and kept_words(a)))
        if begun is not None and res.phase == protocol.PREPARE and kept_words(begun):  # may be part done
            self.kept = (*self.kept, kept_words(begun) + " (failed, maybe part done)")
        if not res.ok:
            made = [a for a in done[:len(res.results)] if a.PHASE != protocol.CHECK]
            for record, c in planned or []:
                # its own actions, or for a change that only notifies, the batch's handlers
                if not c.copies and not any(a is m for a in (c.actions or actions) for m in made):
                    record.update(changed=False, applied=False)
            raise ApplyFailed(f"{res.error} (action {res.failed + 1} of {len(actions)}, while "
                              f"{WHILE.get(res.phase, res.phase)}; {len(made)} changes made before it)",
                              res.phase or protocol.SWITCH)

    def run_checks(self, checks: list, after: str | None) -> None:
        """Check mode: the read-only checks run for real, unless an earlier role's changes
        (`after`) would change what they check."""
        if not checks:
            return
        if after:
            for c in checks:
                self.say(f"{'check':<15} {c.desc}: would run after {after} changes the host")
            return
        res = self.call(protocol.Check(actions=checks))
        for r in res.results:
            self.say(f"{'check':<15} {checks[r['index']].desc}: passed")
        if not res.ok:
            raise SpecopsError(f"check failed: {res.error}")

    def previous(self) -> dict[str, str]:
        """What this run replaced: path → "backup" | "absent" (for undo and the release)."""
        return {
            a.path: ("backup" if a.backup else "absent") for a in self.applied if not isinstance(a, protocol.Enable)
        }

    def enabled(self) -> list:
        """The Enable actions this run did (an undo puts each unit's state back)."""
        return [a for a in self.applied if isinstance(a, protocol.Enable)]

    def new_context(self) -> Context:
        """A plan's context: outside check mode, the release this attempt would become (where
        what it replaces is backed up)."""
        ctx = Context(self.host.name, self.opts.check, verify_weights=self.opts.verify_weights)
        if not ctx.check:
            ctx.release_dir = release_dir(new_stamp())
        return ctx

    def lock_and_probe(self, ctx: Context) -> Facts:
        """The probe every op's plan needs, taking the host lock outside check mode (the agent
        then first undoes a switch an earlier run was cut off in); notes what runs before."""
        facts = self.probe([op for _, ops in self.plan for op in ops], lock=not ctx.check)
        if self.running is None:  # before this run changes anything: what an undo starts again
            self.running = [n for n in kinds.unit_refs(self.host)
                            if facts.unit(n).get("ActiveState") in ("active", "activating", "reloading")]
        return facts

    def plan_batch(self, ctx: Context, facts: Facts) -> Planned:
        """Plan every role against the facts, pushing what the batch needs; a REPROBE role's batch
        is applied as soon as it is planned, and the rest planned against a new probe."""
        batch, remaining = Planned(), [op for _, ops in self.plan for op in ops]
        self.report.extra.setdefault("bytes_pushed", 0)
        for role, ops in self.plan:
            role_actions, moved = [], False
            for op in ops:
                c = op.plan(facts, ctx)
                self.report.changes.append(c.record(self.host.name))
                batch.planned += [(self.report.changes[-1], c)] if c.changed else []
                self.out.change(self.host.name, c, ctx.check)
                if c.fails and ctx.check:
                    batch.foreseen.append(f"{c.target}: {c.fails}")
                    self.say(f"{'would fail':<15} {c.target}: {c.fails}")
                role_actions += c.actions
                batch.checks += c.checks
                ctx.notified += [n for n in c.notify if n not in ctx.notified]
                moved = moved or c.moves
                if not ctx.check:
                    self.push(c.uploads)
                    for copy in c.copies:
                        res = peergrant.copy(self, copy)
                        self.report.extra["bytes_copied"] = self.report.extra.get("bytes_copied", 0) + res.received
                        ctx.reserved[copy.device] = ctx.reserved.get(copy.device, 0) + res.received
            batch.pending += role_actions
            remaining = remaining[len(ops):]
            if getattr(role, "REPROBE", False) and (role_actions or moved) and remaining:
                if ctx.check:
                    batch.changed_by = batch.changed_by or role.NAME
                    continue
                # What it installed or fetched goes now; what switches waits for the last batch, with
                # the checks, so that one switch (and one undo) holds all of it.
                now = [a for a in batch.pending if a.PHASE == protocol.PREPARE]
                self.apply(now, batch.planned)
                batch.pending = [a for a in batch.pending if a.PHASE != protocol.PREPARE]
                batch.planned = [(r, c) for r, c in batch.planned
                                 if not c.actions or any(a.PHASE != protocol.PREPARE for a in c.actions)]
                facts = self.probe(remaining).carrying(facts)
        batch.handlers = handlers.actions(ctx.notified, kinds.unit_refs(self.host, self.quick))
        for h in handlers.ordered(ctx.notified):
            # notified, not run yet: the batch's step runs it, or says why it was not needed
            self.say(f"{'handler':<15} {h}: " + ("would be notified" if ctx.check else "notified"))
        return batch

    def check_batch(self, batch: Planned) -> None:
        """Check mode: the read-only checks for real (not in status), and a failure for what the
        facts already show would fail."""
        if self.opts.run_checks:
            self.run_checks(batch.checks, batch.changed_by)
            if batch.foreseen:
                raise SpecopsError("would fail: " + "; ".join(batch.foreseen))

    def apply_batch(self, batch: Planned) -> None:
        """The batch on the host: checks, then preparations, then the switch and its handlers."""
        self.apply(batch.checks + batch.pending + batch.handlers, batch.planned)

    def converge(self, ctx: Context | None = None, facts: Facts | None = None) -> Context:
        """Probe, plan every role and apply (check mode: check), in one call: status, tests."""
        ctx = self.context = ctx or self.new_context()
        batch = self.plan_batch(ctx, facts or self.lock_and_probe(ctx))
        self.check_batch(batch) if ctx.check else self.apply_batch(batch)
        return ctx
