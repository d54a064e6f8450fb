"""All or nothing (issue 45), the parts without a fleet: each action kind's phase, the order a
batch runs its phases in, the foreseen failures --check says, and what a failure before the switch
says and records (the fault hook: test_all_or_nothing_faults.py; the undo:
test_all_or_nothing_undo.py)."""
import json
import os

import pytest

from specops import protocol
from specops.agent import faults
from specops.agent.converge import stage
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


def apt_facts(answer):
    return Facts({"files": {}, "units": {}, "venvs": {}, "checks": {}, "packages": {"pkg": answer}})


def test_a_package_name_a_shell_would_read_is_refused_before_any_probe():
    with pytest.raises(ValueError, match="not a Debian package name"):
        AptPackages(["ok", "x; rm -rf /"])


def test_apt_says_a_package_with_no_candidate_and_installs_in_prepare():
    op = AptPackages(["pkg"])
    assert op.wants().packages == ["pkg"] and not op.wants().checks
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
