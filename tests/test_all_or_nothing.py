"""All or nothing (issue 45), the parts without a fleet: each action kind's phase, the order a
batch runs its phases in, the fault hook's guards, the foreseen failures --check says, an undo of
what a deploy enabled, and what a failure before the switch says and records."""
import json
import os
import subprocess
import sys

import pytest

from specops import protocol
from specops.agent import faults
from specops.agent.converge import stage
from specops.agent.services import units
from specops.errors import ApplyFailed, SpecopsError
from specops.ops import Context, Facts
from specops.ops.apt import AptPackages
from specops.ops.files import File
from support.runs import switchless_run


def test_every_action_kind_runs_in_one_of_the_phases():
    for kind in protocol.ACTION_KINDS:
        cls = protocol.wire._ACTIONS[kind]
        assert cls.PHASE in protocol.PHASES, kind
    assert set(protocol.CHECK_KINDS) == {k for k in protocol.ACTION_KINDS
                                         if protocol.wire._ACTIONS[k].PHASE == protocol.CHECK}
    # what changes what serves is a switch, so an undo covers it
    for cls in (protocol.Write, protocol.Remove, protocol.Enable, protocol.DaemonReload, protocol.Restart,
                protocol.StartUnit, protocol.Purge):
        assert cls.PHASE == protocol.SWITCH, cls.KIND
    for cls in (protocol.AptInstall, protocol.BuildStack, protocol.FetchWeights, protocol.PipInstall):
        assert cls.PHASE == protocol.PREPARE, cls.KIND


@pytest.fixture
def batch(monkeypatch, tmp_path):
    """stage.apply with every action kind's work recorded instead of done."""
    done = []
    monkeypatch.setattr(stage, "APPLY_JOURNAL", str(tmp_path / "apply.json"))
    monkeypatch.setattr(faults, "FAULTS", str(tmp_path / "faults.json"))
    journals = []

    def doing(a, allowed):
        done.append(a.desc)
        journals.append(os.path.exists(stage.APPLY_JOURNAL))
        if a.desc.startswith("bad"):
            raise stage.ActionError(a.desc + " failed")
    monkeypatch.setattr(stage, "DO", {cls: doing for cls in stage.DO})
    return done, journals


def request(*actions):
    return protocol.Apply(actions=list(actions), stamp="20261207T000000Z", services=[protocol.UnitRef(name="s")])


def test_a_batch_checks_then_prepares_then_switches(batch):
    done, journals = batch
    res = stage.apply(request(protocol.Enable(unit="s", desc="enable s"),
                              protocol.AptInstall(packages=["x"], desc="apt"),
                              protocol.DaemonReload(desc="reload"), protocol.Preflight(
                                  python="p", script="", argv=[], expect={}, service="s", desc="preflight"),
                              protocol.Mkdir(path="/d", desc="mkdir")))
    assert res.ok and done == ["preflight", "apt", "mkdir", "enable s", "reload"]
    assert journals == [False, False, False, True, True]  # the switch, and only it, is journaled
    assert not os.path.exists(stage.APPLY_JOURNAL)  # and the journal goes once it is done


def test_a_failed_preparation_switches_nothing(batch):
    done, _ = batch
    res = stage.apply(request(protocol.Enable(unit="s", desc="enable s"), protocol.Run(cmd="x", desc="bad run"),
                              protocol.Restart(unit=protocol.UnitRef(name="s"), desc="restart")))
    assert not res.ok and res.phase == protocol.PREPARE and res.failed == 1 and done == ["bad run"]


def test_a_failed_switch_says_so_and_keeps_its_journal_for_the_undo(batch):
    done, _ = batch
    res = stage.apply(request(protocol.Enable(unit="s", desc="enable s"), protocol.Run(cmd="x", desc="run"),
                              protocol.Restart(unit=protocol.UnitRef(name="s"), desc="bad restart")))
    assert (not res.ok and res.phase == protocol.SWITCH and res.failed == 2
            and done == ["run", "enable s", "bad restart"])
    journal = json.load(open(stage.APPLY_JOURNAL))  # if the controller's undo never comes, the next run's
    assert journal["failed"] and journal["begun"] == 1 and os.stat(stage.APPLY_JOURNAL).st_mode & 0o077 == 0


def test_a_file_refused_while_staged_fails_the_batch_before_anything_runs(batch, monkeypatch):
    done, _ = batch
    write = protocol.Write(path="/etc/x", data="", desc="update /etc/x")

    def refuse(self):
        raise stage.refusal(write, "systemd-analyze verify refused /etc/x: bad")
    monkeypatch.setattr(stage.Batch, "stage", refuse)
    res = stage.apply(request(protocol.AptInstall(packages=["x"], desc="apt"), write))
    assert not res.ok and res.phase == protocol.CHECK and res.failed == 1 and done == []


def test_a_write_waits_for_the_preparation_that_makes_its_directory(batch, monkeypatch, tmp_path):
    done, _ = batch
    made = tmp_path / "new"

    class Staged:
        bytecode = None

        def __init__(self, action, allowed):
            self.action = action
            done.append("staged " + action.path)

        def write(self, validate=True):
            return self

        def commit(self):
            done.append("renamed")
    monkeypatch.setattr(stage, "Staged", Staged)
    stage.DO[protocol.Mkdir] = lambda a, allowed: (done.append("mkdir"), made.mkdir())
    res = stage.apply(request(protocol.Write(path=str(made / "f"), data=""), protocol.Mkdir(path=str(made))))
    assert res.ok and done == ["mkdir", "staged " + str(made / "f"), "renamed"]


def test_the_journal_says_how_to_undo_and_holds_no_content(batch, monkeypatch):
    seen = []
    real = stage.Journal.begin
    monkeypatch.setattr(stage.Journal, "begin", lambda self, n: (real(self, n), seen.append(
        json.load(open(stage.APPLY_JOURNAL)))))
    stage.apply(request(protocol.Enable(unit="s", was="disabled", desc="enable s"),
                        protocol.Restart(unit=protocol.UnitRef(name="s"), desc="restart")))
    assert seen[-1]["stamp"] == "20261207T000000Z" and seen[-1]["begun"] == 1
    assert seen[-1]["steps"][0] == {"kind": "enable", "desc": "enable s", "unit": "s", "enable": True, "now": False,
                                    "was": "disabled"}
    step = stage.journal_step(protocol.Write(path="/etc/x", data="c2VjcmV0", backup="/r/previous/etc/x"))
    assert step == {"kind": "write", "desc": "write", "path": "/etc/x", "backup": True}  # never the data


def write_fault(path, doc, mode=0o600):
    with open(path, "w") as f:
        json.dump(doc, f)
    os.chmod(path, mode)


def test_a_fault_fires_at_the_nth_action_of_its_kind_once(tmp_path, monkeypatch):
    path = str(tmp_path / "faults.json")
    monkeypatch.setattr(faults, "FAULTS", path)
    monkeypatch.setattr(faults, "_seen", {})
    write_fault(path, {"kind": "write", "nth": 2})
    faults.at("write")
    faults.at("restart")
    with pytest.raises(stage.ActionError, match="write failed: a fault injected on request"):
        faults.at("write")
    assert not os.path.exists(path)  # consumed
    faults.at("write")


@pytest.mark.skipif(os.geteuid() != 0, reason="the guard is on root's ownership")
def test_a_fault_file_anyone_else_could_write_is_ignored(tmp_path, monkeypatch):
    path = str(tmp_path / "faults.json")
    monkeypatch.setattr(faults, "FAULTS", path)
    for mode, owner in ((0o620, 0), (0o602, 0), (0o600, 1000)):
        monkeypatch.setattr(faults, "_seen", {})
        write_fault(path, {"kind": "write"}, mode)
        os.chown(path, owner, 0)
        faults.at("write")  # not fired
        assert os.path.exists(path)
        os.unlink(path)
    os.symlink(str(tmp_path / "elsewhere"), path)
    write_fault(str(tmp_path / "elsewhere"), {"kind": "write"})
    faults.at("write")  # a link is never followed
    assert os.path.exists(str(tmp_path / "elsewhere"))


@pytest.mark.parametrize("how, calls, printed", [
    ("kill", "faults.at('restart'); print('before', flush=True); faults.at('write')", "before\n"),
    ("kill-after", "faults.at('write'); print('did', flush=True); faults.after('write')", "did\n"),  # once done
])
def test_a_kill_fault_kills_the_agent_there(tmp_path, how, calls, printed):
    path = tmp_path / "faults.json"
    write_fault(path, {"kind": "write", "how": how})
    code = f"from specops.agent import faults; faults.FAULTS = {str(path)!r}; {calls}; print('after')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert res.returncode == -9 and res.stdout == printed


def apt_facts(answer):
    return Facts({"files": {}, "units": {}, "venvs": {}, "checks": {"dpkg:pkg": answer}})


def test_a_package_name_a_shell_would_read_is_refused_before_any_probe():
    with pytest.raises(ValueError, match="not a Debian package name"):
        AptPackages(["ok", "x; rm -rf /"])


def test_apt_says_a_package_with_no_candidate_and_installs_in_prepare():
    op = AptPackages(["pkg"])
    assert "apt-cache policy pkg" in op.wants().checks["dpkg:pkg"]
    assert not op.plan(apt_facts(0), Context("h", False)).changed
    c = op.plan(apt_facts(1), Context("h", False))
    assert isinstance(c.actions[0], protocol.AptInstall) and not c.fails
    c = op.plan(apt_facts(2), Context("h", True))
    assert c.actions and "pkg: no candidate in the host's package lists" in c.fails


def test_check_mode_fails_on_what_the_facts_show_will_fail():
    import io
    import types
    from specops.inventory import Host
    from specops.output.report import Redactor, Reporter
    from specops.run import HostRun, Options, _one
    host = Host("a", {})
    out = Reporter(Redactor([host]), show_diff=False, stream=io.StringIO())
    role = types.SimpleNamespace(NAME="monitoring", ops=lambda h: [AptPackages(["pkg"])], REPROBE=False)
    run = HostRun(host, [role], Options(check=True), out)
    run.call = lambda request, **kw: protocol.ApplyResult(ok=True)
    report = _one(run, lambda run: run.converge(Context("a", True), apt_facts(2)))
    assert report.error.startswith("would fail: apt packages: pkg: no candidate"), report.error
    run = HostRun(host, [role], Options(check=True, run_checks=False), out)  # status: said, not failed
    report = _one(run, lambda run: run.converge(Context("a", True), apt_facts(2)))
    assert report.error is None


def file_facts(**fact):
    return Facts({"files": {"/etc/x": {"path": "/etc/x", "exists": False, "dir_device": 7, **fact}},
                  "units": {}, "venvs": {}, "checks": {}})


def test_a_write_the_facts_show_cannot_be_staged_is_refused_at_plan_time():
    from specops.ops.base import PlanError
    with pytest.raises(PlanError, match="/etc is on a read-only filesystem"):
        File("/etc/x", "abc").plan(file_facts(dir_read_only=True, dir_free=10**9), Context("h", True))
    ctx = Context("h", False)
    File("/etc/x", "a" * 600).plan(file_facts(dir_read_only=False, dir_free=1000), ctx)
    with pytest.raises(PlanError, match="has 0.0 MiB free, and this run stages"):  # two writes on one filesystem
        File("/etc/x", "b" * 600).plan(file_facts(dir_read_only=False, dir_free=1000), ctx)


@pytest.mark.parametrize("enable, now, was, undo", [
    (True, False, "disabled", ["systemctl", "disable", "--quiet", "--", "u"]),
    (True, True, None, ["systemctl", "disable", "--quiet", "--now", "--", "u"]),  # a unit this deploy created
    (False, False, "enabled", ["systemctl", "enable", "--quiet", "--", "u"]),
    (True, True, "enabled", None),  # it was enabled: nothing to put back
    (True, False, "masked", None),  # not a state an enable makes: left alone
])
def test_an_undo_puts_back_what_an_enable_changed(monkeypatch, enable, now, was, undo):
    ran = []
    monkeypatch.setattr(units, "run_quiet", lambda argv, **kw: ran.append(argv) or (0, ""))
    units.unenable(protocol.Enable(unit="u", enable=enable, now=now, was=was))
    assert ran == ([undo] if undo else [])


def test_a_failure_before_the_switch_records_the_attempt_and_touches_nothing():
    from specops.flows import pipeline
    sent = []
    Run = lambda: switchless_run(["apt-get install x"], sent)  # noqa: E731
    failure = ApplyFailed("apt-get install y failed (exit 100) (action 3 of 9, while preparing, before the switch; "
                          "1 changes made before it)", protocol.PREPARE)
    with pytest.raises(SpecopsError) as e:
        pipeline.failed(Run(), "/var/lib/specops/releases/20261207T000000Z", failure)
    assert str(e.value).endswith("; nothing that serves was touched; left in place (not undone): apt-get install x")
    (record,) = sent
    assert record.status == protocol.ROLLED_BACK and record.stamp == "20261207T000000Z" and record.managed == []
    assert record.manifest["kept"] == ["apt-get install x"] and "apt-get install y failed" in record.manifest["summary"]
    assert "venv" not in record.manifest  # an attempt keeps no stack: one it built is pruned


def test_a_failed_switch_is_undone():
    from specops.flows import pipeline
    called = []
    real = pipeline.undo
    pipeline.undo = lambda run, d, f: called.append(f) or (_ for _ in ()).throw(SpecopsError("undone"))
    try:
        for applied in (["a write"], []):  # a restart that failed stopped the server: undone too
            run = type("Run", (), {"applied": applied, "acted": True, "kept": [], "applying": False})()
            with pytest.raises(SpecopsError, match="undone"):
                pipeline.failed(run, "/r/1", ApplyFailed("restart failed", protocol.SWITCH))
    finally:
        pipeline.undo = real
    assert len(called) == 2


def test_an_undo_starts_again_only_what_ran_before(monkeypatch, tmp_path):
    from specops.agent import rollback
    did = []
    monkeypatch.setattr(rollback, "RELEASES", str(tmp_path))
    monkeypatch.setattr(rollback.units, "stop_unit", lambda ref, others, measure: did.append(("stop", ref.name)))
    monkeypatch.setattr(rollback.units, "restart", lambda ref, others: did.append(("restart", ref.name)))
    monkeypatch.setattr(rollback.units, "daemon_reload", lambda *a: did.append(("reload",)))
    refs = [protocol.UnitRef(name="a"), protocol.UnitRef(name="b"), protocol.UnitRef(name="c")]
    rollback.put_back("S", {}, [], refs, running=["a", "c"], concerned=["a", "b"])
    assert did == [("stop", "b"), ("restart", "a")]  # c: its switch did not concern it
    did.clear()
    rollback.put_back("S", {}, [], refs, running=None)  # not known: every one, as before
    assert did == [("restart", "a"), ("restart", "b"), ("restart", "c")]
    did.clear()
    rollback.put_back("S", {"/etc/x": "backup"}, [], refs, running=["a"], restarts=False)
    assert did == []  # a switch that changed nothing (no backup was made) and reached no restart


def test_a_cut_off_switch_is_said_as_its_journal_says(tmp_path, monkeypatch):
    from specops.agent import rollback
    path = tmp_path / "apply.json"
    monkeypatch.setattr(rollback, "APPLY_JOURNAL", str(path))
    steps = [{"kind": "write", "desc": f"update /etc/{n}", "path": f"/etc/{n}", "backup": True} for n in "abc"]
    path.write_text(json.dumps({"task": "deploy", "stamp": "S", "services": [], "steps": steps, "begun": 1}))
    said = rollback.cut_off(undo_it=False)
    assert said == {"task": "deploy", "done": ["update /etc/a"], "cut_at": "update /etc/b",
                    "not_done": ["update /etc/c"], "undone": None}
    assert path.exists()  # only a run that holds the lock undoes it
    path.write_text(json.dumps({"task": "deploy", "done": ["x"], "not_done": ["y"]}))  # an older agent's journal
    said = rollback.cut_off(undo_it=True)
    assert said["done"] == ["x"] and "not undone" in said["undone"]["note"] and not path.exists()
    path.write_text(json.dumps({"task": "deploy", "stamp": "../../etc", "steps": steps, "begun": 0}))
    said = rollback.cut_off(undo_it=True)  # a journal that names no release undoes nothing, and stays
    assert "names no release" in said["undone"]["error"] and path.exists()
    os.chmod(path, 0o646)
    assert rollback.cut_off(undo_it=False) is None  # one anyone could have written is no journal


def test_a_restore_stages_every_file_before_it_renames_any(monkeypatch, tmp_path):
    from specops.agent import rollback
    events = []

    class Staged:
        def __init__(self, action, allowed):
            self.path = action.path

        def write(self):
            if self.path == "/etc/b":
                raise OSError(28, "No space left on device")
            events.append(("staged", self.path))
            return self

        def commit(self):
            events.append(("renamed", self.path))

        def discard(self):
            events.append(("discarded", self.path))
    monkeypatch.setattr(rollback, "Staged", Staged)
    monkeypatch.setattr(rollback, "_current_sha", lambda path, allowed: None)
    for name in "abc":
        (tmp_path / name).write_text(name)
    with pytest.raises(OSError):
        rollback._restore({f"/etc/{n}": str(tmp_path / n) for n in "abc"})
    assert events == [("staged", "/etc/a"), ("discarded", "/etc/a")]  # nothing renamed


def test_the_agent_refuses_a_package_name_a_shell_would_read(monkeypatch):
    from specops.agent.converge import installs
    ran = []
    monkeypatch.setattr(installs, "run_streamed", lambda cmd, desc: ran.append(cmd))
    with pytest.raises(stage.ActionError, match="not a Debian package name"):
        installs.apt_install(protocol.AptInstall(packages=["ok", "$(reboot)"]))
    installs.apt_install(protocol.AptInstall(packages=["prometheus-node-exporter"]))
    assert ran == ["apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                   "--no-install-recommends -o Dpkg::Use-Pty=0 -- prometheus-node-exporter"]


def test_a_failed_batch_leaves_nothing_staged(batch, monkeypatch):
    done, _ = batch
    left = []

    class Staged:
        bytecode = None

        def __init__(self, action, allowed):
            self.action = action
            left.append(self)

        def write(self, validate=True):
            return self

        def discard(self):
            left.remove(self)
    monkeypatch.setattr(stage, "Staged", Staged)
    res = stage.apply(request(protocol.Write(path="/etc/x", data=""), protocol.Run(cmd="x", desc="bad run")))
    assert not res.ok and res.phase == protocol.PREPARE and left == []


def test_the_undo_is_done_with_its_own_journal_only(tmp_path, monkeypatch):
    from specops.agent import rollback
    path = tmp_path / "apply.json"
    monkeypatch.setattr(rollback, "APPLY_JOURNAL", str(path))
    monkeypatch.setattr(rollback, "put_back", lambda *a: ([], []))
    monkeypatch.setattr(rollback, "current_manifest", lambda: None)
    monkeypatch.setattr(rollback, "current", lambda: None)
    req = protocol.Undo(stamp="20261207T000000.000000Z", previous={}, services=[])
    path.write_text(json.dumps({"stamp": "20261207T000001.000000Z", "steps": []}))
    rollback.undo(req)
    assert path.exists()  # another attempt's: the next run's to undo
    path.write_text(json.dumps({"stamp": "20261207T000000.000000Z", "steps": []}))
    rollback.undo(req)
    assert not path.exists()


def test_a_recovery_refuses_a_journal_naming_a_path_that_is_not_plain(tmp_path, monkeypatch):
    from specops.agent import rollback
    path = tmp_path / "apply.json"
    monkeypatch.setattr(rollback, "APPLY_JOURNAL", str(path))
    for bad in ("etc/x", "/etc/../root/.ssh/authorized_keys"):
        step = {"kind": "write", "desc": "update x", "path": bad, "backup": True}
        path.write_text(json.dumps({"task": "deploy", "stamp": "20261207T000000.000000Z", "steps": [step], "begun": 0}))
        assert "not a plain absolute path" in rollback.cut_off(undo_it=True)["undone"]["error"]
    path.write_text(json.dumps({"task": "deploy", "stamp": "20261207T000000.000000Z\n", "steps": [], "begun": 0}))
    assert "names no release" in rollback.cut_off(undo_it=True)["undone"]["error"]
    path.write_text(json.dumps({"task": "deploy", "stamp": "20261207T000000.000000Z", "steps": ["x"], "begun": 0}))
    assert "does not read as a switch's" in rollback.cut_off(undo_it=True)["undone"]["error"]


def test_a_recovery_that_fails_stops_the_run_before_anything_else(monkeypatch):
    from specops.inventory import Host
    from specops.output.report import Redactor, Reporter
    from specops.run import HostRun, Options
    import io
    host = Host("a", {})
    run = HostRun(host, [], Options(check=True), Reporter(Redactor([host]), show_diff=False, stream=io.StringIO()))
    cut = {"task": "deploy", "done": [], "cut_at": "update /etc/x", "not_done": [], "undone": {"error": "disk full"}}
    run.call = lambda req, **kw: protocol.ProbeResult(time=0, hostname="a", python="p", interrupted=cut)
    with pytest.raises(SpecopsError, match="half-done and could not be undone: disk full"):
        run.probe([])


def test_a_failed_step_of_a_switch_is_undone_too_and_a_lost_answer_is_unknown():
    import io
    from specops.inventory import Host
    from specops.output.report import Redactor, Reporter
    from specops.run import HostRun, Options
    host = Host("a", {})
    run = HostRun(host, [], Options(), Reporter(Redactor([host]), show_diff=False, stream=io.StringIO()))
    write = protocol.Write(path="/etc/x", data="", backup="/r/previous/etc/x")
    run.call = lambda req, **kw: protocol.ApplyResult(ok=False, failed=1, phase=protocol.SWITCH, error="no",
                                                      results=[{"index": 0, "out": None}])
    with pytest.raises(ApplyFailed):
        run.apply([protocol.AptInstall(packages=["p"], desc="apt-get install p"), write])
    assert run.applied == [write] and run.kept == ("apt-get install p",)

    def lost(req, **kw):
        raise SpecopsError("t1: the connection was lost")
    run.call = lost
    with pytest.raises(SpecopsError):
        run.apply([write])
    from specops.flows import pipeline
    with pytest.raises(SpecopsError, match="outcome on the host is not known: a switch it began is undone by the next"):
        pipeline.failed(run, "/r/1", SpecopsError("t1: the connection was lost"))


def test_a_reprobe_role_sends_its_preparations_alone_and_the_switch_waits(monkeypatch):
    import io
    import types
    from specops.inventory import Host
    from specops.ops import Op
    from specops.output.report import Redactor, Reporter
    from specops.run import HostRun, Options

    class Installs(Op):
        def plan(self, facts, ctx):
            facts.assume_file("/etc/unit", sha256="new")
            return self._change("x", "install", [protocol.AptInstall(packages=["p"], desc="apt"),
                                                 protocol.Write(path="/etc/unit", data="", desc="unit")])

    class Reads(Op):
        def plan(self, facts, ctx):
            seen.append(facts.file("/etc/unit")["sha256"])
            return self._change("y", "ok")
    seen, sent = [], []
    host = Host("a", {})
    roles = [types.SimpleNamespace(NAME="first", REPROBE=True, ops=lambda h: [Installs()]),
             types.SimpleNamespace(NAME="second", ops=lambda h: [Reads()])]
    run = HostRun(host, roles, Options(), Reporter(Redactor([host]), show_diff=False, stream=io.StringIO()))
    old = {"files": {"/etc/unit": {"path": "/etc/unit", "sha256": "old"}}, "units": {}, "venvs": {}, "checks": {}}
    monkeypatch.setattr(run, "probe", lambda ops, *a, **kw: Facts(json.loads(json.dumps(old))))
    run.call = lambda req, **kw: (sent.append([a.desc for a in req.actions]), protocol.ApplyResult(ok=True))[1]
    run.converge(Context("a", False, release_dir="/r/1"), Facts(json.loads(json.dumps(old))))
    assert sent == [["apt"], ["unit"]]  # one switch, in the last batch
    assert seen == ["new"]  # the later role plans against what the switch will make


def test_a_pip_into_a_venv_in_place_is_said_so_and_an_import_check_is_no_change():
    from specops.converging import kept_words
    pip = protocol.PipInstall(python="/opt/sglang/venv/bin/python", specs=["torch"], desc="pip install torch")
    assert kept_words(pip) == "pip install torch (into /opt/sglang/venv in place: its next start imports it)"
    assert kept_words(protocol.Expect(python="p", code="", expect={}, what="")) is None
    build = protocol.BuildStack(path="/opt/specops/venvs/k", python="python3", specs=[], sources=[], uv_pip_args=[],
                                defines={}, need=0, check="", expect={})
    assert kept_words(build) is None  # pruned with the attempt's record, not left in place


def test_a_backup_is_whole_or_absent(tmp_path, monkeypatch):
    from specops.agent import safefs
    src = tmp_path / "src"
    src.write_text("old content")
    to = tmp_path / "previous" / "src"
    real = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b: (_ for _ in ()).throw(OSError(5, "I/O error")))
    dfd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError):
            safefs._copy_out(dfd, "src", str(to))
        assert os.listdir(to.parent) == []  # no torn file under its name, no temporary left
        monkeypatch.setattr(os, "rename", real)
        assert safefs._copy_out(dfd, "src", str(to)) and to.read_text() == "old content"
    finally:
        os.close(dfd)


def test_a_file_refused_once_the_preparations_ran_fails_before_the_switch(batch, monkeypatch):
    done, _ = batch
    write = protocol.Write(path="/opt/new/x", data="", desc="update /opt/new/x")

    def staging(self, every=False):
        if every:
            raise stage.refusal(write, "its validator refused it")
    monkeypatch.setattr(stage.Batch, "stage", staging)
    res = stage.apply(request(protocol.AptInstall(packages=["x"], desc="apt"), write,
                                  protocol.Restart(unit=protocol.UnitRef(name="s"), desc="restart")))
    assert not res.ok and res.phase == protocol.PREPARE and res.failed == 1 and done == ["apt"]


def test_a_refusal_before_the_switch_records_nothing():
    from specops.flows import pipeline
    sent = []
    Run = lambda: switchless_run(["manifest of /models/x"], sent)  # noqa: E731
    for failure, planned in ((ApplyFailed("preflight refused", protocol.CHECK), True),
                             (SpecopsError("hunk 1 of 1 does not apply"), False)):  # after a REPROBE role's batch
        with pytest.raises(SpecopsError, match="nothing that serves was touched; left in place"):
            pipeline.failed(Run(), "/r/1", failure, planned=planned)
    assert sent == []
