"""A unit's kept fact (agent/services/unitkeep.py): reused only while nothing systemd would answer
differently can have changed.  Each protective line has a case here; systemd's files are played
by a directory of the test's own.  No fleet."""
import os
import time

import pytest

from specops.agent.services import unitkeep

FACT = {"ActiveState": "active", "SubState": "running", "MainPID": "4242", "InvocationID": "run1",
        "FragmentPath": None, "DropInPaths": ""}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """systemd's directories and run files under tmp_path, a unit `sglang` running as PID 4242."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    for d in (etc / "multi-user.target.wants", run, run / "units"):
        d.mkdir(parents=True)
    unit = etc / "sglang.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    (etc / "multi-user.target.wants/sglang.service").symlink_to(unit)
    (tmp_path / "boot_id").write_text("boot-a\n")
    (run / "units/invocation:sglang.service").symlink_to("run1")
    (run / "generator").mkdir()
    monkeypatch.setattr(unitkeep, "WRITTEN", (str(etc), str(run / "system")))
    monkeypatch.setattr(unitkeep, "RELOADED", (str(run / "generator"), str(run / "generator.late")))
    monkeypatch.setattr(unitkeep, "VENDOR", str(tmp_path / "lib"))
    monkeypatch.setattr(unitkeep, "TRANSIENT", str(run / "transient"))
    monkeypatch.setattr(unitkeep, "BOOT_ID", str(tmp_path / "boot_id"))
    monkeypatch.setattr(unitkeep, "INVOCATION", str(run / "units/invocation:"))
    monkeypatch.setattr(unitkeep, "UNIT_FACTS", str(tmp_path / "state/units.json"))
    monkeypatch.setattr(unitkeep, "TICK", 0.0)
    started = {4242: "1000"}
    old = time.time() - 60
    for p in (unit, etc / "multi-user.target.wants", etc, run / "generator"):
        os.utime(p, (old, old), follow_symlinks=False)

    class Host:
        fact = {**FACT, "FragmentPath": str(unit)}
        files, starttime = etc, staticmethod(lambda pid: started.get(pid))

        def keep(self):
            """As probe.unit_fact keeps a show systemd answered just now."""
            unitkeep.keep("sglang", {}, self.fact, time.time(), self.starttime)
            assert unitkeep.load()["sglang"]["fact"] == self.fact

        def reused(self):
            return unitkeep.reuse("sglang", unitkeep.load(), self.starttime)
    h = Host()
    h.started, h.tmp = started, tmp_path
    return h


def test_a_kept_fact_is_reused_while_nothing_moved(host):
    host.keep()
    assert host.reused() == host.fact


def _disable(h):
    os.unlink(h.files / "multi-user.target.wants/sglang.service")


def _edit_in_place(h):
    unit = h.files / "sglang.service"
    unit.write_text(unit.read_text().replace("true", "echo"))  # same size, same inode


def _drop_in(h):
    d = h.files / "sglang.service.d"
    d.mkdir()
    (d / "override.conf").write_text("[Service]\nUser=nobody\n")


def _restarted(h):
    os.unlink(h.tmp / "run/units/invocation:sglang.service")
    os.symlink("run2", h.tmp / "run/units/invocation:sglang.service")


def _stopped(h):
    os.unlink(h.tmp / "run/units/invocation:sglang.service")


def _pid_reused(h):
    h.started[4242] = "2000"


def _rebooted(h):
    (h.tmp / "boot_id").write_text("boot-b\n")


def _reloaded(h):
    """daemon-reload: systemd makes its generators' directory anew (what PID 1 loaded late now shows)."""
    os.rmdir(h.tmp / "run/generator")
    os.mkdir(h.tmp / "run/generator")


def _packaged(h):
    """A package's drop-in for the unit, in the vendor directory."""
    d = h.tmp / "lib/sglang.service.d"
    d.mkdir(parents=True)


def _transient(h):
    """A transient unit of that name (systemd-run --unit sglang)."""
    (h.tmp / "run/transient").mkdir()
    (h.tmp / "run/transient/sglang.service").write_text("[Service]\n")


@pytest.mark.parametrize("change", [_disable, _edit_in_place, _drop_in, _restarted, _stopped, _pid_reused,
                                    _rebooted, _reloaded, _packaged, _transient])
def test_a_kept_fact_is_dropped_when_systemd_could_answer_otherwise(host, change):
    host.keep()
    change(host)
    assert host.reused() is None


def test_an_edited_drop_in_named_by_systemd_is_seen(host, tmp_path):
    drop = tmp_path / "lib/sglang.service.d/10-limits.conf"
    drop.parent.mkdir(parents=True)
    drop.write_text("[Service]\nLimitNOFILE=1\n")
    old = time.time() - 60
    os.utime(drop, (old, old))
    host.fact = {**host.fact, "DropInPaths": str(drop)}
    host.keep()
    assert host.reused() == host.fact
    drop.write_text("[Service]\nLimitNOFILE=2\n")
    assert host.reused() is None


@pytest.mark.parametrize("fact", [{"ActiveState": "activating", "SubState": "start"},
                                  {"ActiveState": "active", "SubState": "exited"},
                                  {"MainPID": "0"}, {"InvocationID": "run0"}, {"Job": "77"}])
def test_only_a_running_unit_of_the_run_witnessed_is_kept(host, fact):
    seen, now = unitkeep.witness("sglang", unitkeep.paths(host.fact)), time.time()
    assert unitkeep.keepable("sglang", host.fact, seen, now)
    assert not unitkeep.keepable("sglang", {**host.fact, **fact}, seen, now)


def test_a_write_within_a_tick_before_systemd_was_asked_is_not_kept(host, monkeypatch):
    """A write while systemd was asked, or a second write in the same tick of the kernel's coarse
    clock as the last one, would not show in the files' times: such a witness is not kept, and a
    kept one is forgotten."""
    host.keep()  # (the fixture's files were made just now: its tick is 0)
    monkeypatch.setattr(unitkeep, "TICK", 0.05)
    asked = time.time()
    (host.files / "sglang.service").write_text("[Service]\nExecStart=/bin/false\n")
    unitkeep.keep("sglang", unitkeep.load(), host.fact, asked, host.starttime)
    assert unitkeep.load() == {"sglang": None} and host.reused() is None
    now = time.time()
    assert unitkeep.settled(time.time_ns() - 10 ** 8, now) and not unitkeep.settled(time.time_ns() - 10 ** 7, now)
    whole_seconds = (time.time_ns() // 10 ** 9 - 1) * 10 ** 9  # a filesystem that keeps seconds
    assert not unitkeep.settled(whole_seconds, now)


def test_kept_facts_never_follow_a_link(host, tmp_path):
    host.keep()
    real = tmp_path / "state/units.json"
    os.rename(real, tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", real)
    assert unitkeep.load() == {} and host.reused() is None


def test_nothing_is_kept_where_a_reload_would_not_show(host, tmp_path):
    """No generators' directory (a host whose systemd runs none): a daemon-reload after an edit
    systemd had not loaded would leave no trace, so nothing is kept."""
    os.rmdir(tmp_path / "run/generator")
    seen = unitkeep.witness("sglang", unitkeep.paths(host.fact))
    assert not unitkeep.keepable("sglang", host.fact, seen, time.time())


def test_a_main_process_gone_before_it_was_kept_is_not_kept(host):
    """MainPID's start time unread (gone since systemd answered): nothing to tie the fact to its run."""
    host.started.clear()
    unitkeep.keep("sglang", {}, host.fact, time.time(), host.starttime)
    assert unitkeep.load().get("sglang") is None


def test_another_units_transient_file_or_a_login_session_changes_nothing(host, tmp_path):
    """pam_systemd writes each SSH login's session scope into /run/systemd/transient."""
    host.keep()
    (tmp_path / "run/transient").mkdir()
    (tmp_path / "run/transient/session-7.scope").write_text("[Scope]\n")
    assert host.reused() == host.fact


def test_kept_facts_with_a_second_name_are_not_read(host, tmp_path):
    """A hard link to the kept facts (made while the directory was open to others) is not trusted."""
    host.keep()
    os.link(tmp_path / "state/units.json", tmp_path / "other-name.json")
    assert unitkeep.load() == {} and host.reused() is None
