"""All or nothing (issue 45), the undo without a fleet: what an undo puts back (an enable, the files
of a switch, whole backups) and starts again, a switch cut off as its journal says, and a recovery
that refuses a journal or fails.  No fleet."""
import json
import os

import pytest

from specops import protocol
from specops.agent.services import units
from specops.errors import ApplyFailed, SpecopsError


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
