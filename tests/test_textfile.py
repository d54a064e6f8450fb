"""node_exporter's textfile (specops/agent/textfile.py) and the monitoring role's units: the
exposition is what the collector parses, holds no secret, and is never read torn."""
import json
import os
import stat

import pytest

from specops import protocol
from specops.agent import textfile
from specops.agent.services.verdicts import record as record_verdicts
from specops.errors import UsageError
from support.textfile import SECRET, parse, release

def test_the_textfile_says_the_release_its_figures_and_drift_and_never_a_secret(tmp_path, monkeypatch):
    unit, env = release(tmp_path, monkeypatch, perf={"accept_length": {"8": 2.5, "1": 3.1},
                                                     "speedup": {"1": 1.9, "8": 1.2}})
    out = tmp_path / "textfile"
    out.mkdir()
    res = textfile.write(protocol.Textfile(directory=str(out)))
    text = (out / "specops.prom").read_text()
    assert res.path == str(out / "specops.prom") and res.bytes == len(text)
    assert SECRET not in text
    got = parse(text)
    svc = ("service", "sglang")
    info = [k for k in got if k[0] == "specops_release_info"]
    assert len(info) == 1 and dict(info[0][1]) == {"service": "sglang", "stamp": "20261206T120000.000000Z",
                                                   "sglang_version": "0.5.23", "venv": "/opt/specops/venvs/abc",
                                                   "weights_digest": "d" * 16}
    assert got[("specops_release_accept_length", frozenset({svc, ("source", "spec-bench")}))] == 3.1  # lowest level
    assert got[("specops_release_speedup", frozenset({svc, ("source", "spec-bench")}))] == 1.9
    assert got[("specops_spec_num_draft_tokens", frozenset({svc}))] == 4
    assert got[("specops_gate_min_accept_length", frozenset({svc}))] == 2.5
    assert got[("specops_cuda_graph_deployed", frozenset({svc}))] == 1
    assert got[("specops_unit_restarts_total", frozenset({svc}))] == 2
    assert got[("specops_drift", frozenset({svc, ("kind", "files")}))] == 0
    # An edit by hand is drift, and so is a file gone.
    unit.write_text("[Service]\nExecStart=/bin/false\n")
    textfile.write(protocol.Textfile(directory=str(out)))
    assert parse((out / "specops.prom").read_text())[("specops_drift", frozenset({svc, ("kind", "files")}))] == 1


def test_verify_s_verdict_reaches_the_textfile_and_a_still_starting_one_does_not(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch)
    out = tmp_path / "tf"
    out.mkdir()
    record_verdicts([protocol.ServiceReport(name="sglang", failures=["/generate answered 500"])])
    record_verdicts([protocol.ServiceReport(name="sglang", starting=True)])
    textfile.write(protocol.Textfile(directory=str(out)))
    assert parse((out / "specops.prom").read_text())[("specops_verified", frozenset({("service", "sglang")}))] == 0
    record_verdicts([protocol.ServiceReport(name="sglang")])
    textfile.write(protocol.Textfile(directory=str(out)))
    assert parse((out / "specops.prom").read_text())[("specops_verified", frozenset({("service", "sglang")}))] == 1


def test_spec_tune_s_measure_of_what_runs_is_the_figure_when_no_spec_bench_ran(tmp_path, monkeypatch):
    tune = {"candidates": [
        {"settings": {"num_steps": 5, "eagle_topk": 1, "num_draft_tokens": 6}, "speedup": {"1": 2.2},
         "levels": [{"concurrency": 1, "figures": {"accept_length": 3.6}}]},
        {"settings": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}, "speedup": {"1": 1.8},
         "levels": [{"concurrency": 1, "figures": {"accept_length": 2.9}}]}]}
    release(tmp_path, monkeypatch, tune=tune)
    out = tmp_path / "tf"
    out.mkdir()
    textfile.write(protocol.Textfile(directory=str(out)))
    got = parse((out / "specops.prom").read_text())
    assert got[("specops_release_accept_length", frozenset({("service", "sglang"), ("source", "spec-tune")}))] == 2.9


def test_a_write_cut_off_leaves_the_old_file_whole_and_no_debris_the_collector_reads(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch)
    out = tmp_path / "tf"
    out.mkdir()
    textfile.write(protocol.Textfile(directory=str(out)))
    before = (out / "specops.prom").read_text()

    def crash(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(textfile.os, "fsync", crash)
    with pytest.raises(OSError):
        textfile.write(protocol.Textfile(directory=str(out)))
    assert (out / "specops.prom").read_text() == before
    assert os.listdir(out) == ["specops.prom"]


def test_a_label_value_cannot_break_out_of_its_quotes():
    line = textfile.sample("specops_release_info", {"service": 'a"b\\c\nd'}, 1)
    assert line == 'specops_release_info{service="a\\"b\\\\c\\nd"} 1.0'


def test_the_textfile_is_written_only_into_a_directory_root_alone_can_write(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777 | stat.S_ISVTX)
    with pytest.raises(textfile.safefs.UnsafePath):
        textfile.write(protocol.Textfile(directory=str(shared)))
    assert textfile.write(protocol.Textfile(directory=str(tmp_path / "absent"))).path is None


def test_the_refresh_unit_is_bounded_and_read_only_but_for_the_textfile_directory():
    from roles import monitoring
    text = monitoring.service_text("/var/lib/prometheus/node-exporter")
    for line in ("ProtectSystem=strict", "ReadWritePaths=-/var/lib/prometheus/node-exporter", "CPUQuota=20%",
                 "PrivateNetwork=yes", "NoNewPrivileges=yes", "TimeoutStartSec=30"):
        assert line in text.splitlines()
    from specops.inventory.node_exporter import settings
    from specops.inventory import Host
    with pytest.raises(UsageError, match="h: monitoring.textfile_dir: a textfile_dir is a plain"):  # read once
        settings(Host("h", {"monitoring": {"textfile_dir": "/var/lib/x ReadWritePaths=/"}}))
    assert settings(Host("h", {"monitoring": True})).textfile_dir == "/var/lib/prometheus/node-exporter"


def test_monitoring_is_true_false_or_a_mapping_of_its_settings():
    from specops.inventory import checker
    from roles import monitoring
    for ok in (True, False, {"refresh": "30s"}, {"textfile_dir": "/srv/tf"}):
        checker.check(ok, monitoring.VARS["monitoring"], "h.yml", "monitoring")
    with pytest.raises(UsageError, match="unknown key"):
        checker.check({"refesh": "30s"}, monitoring.VARS["monitoring"], "h.yml", "monitoring")
    with pytest.raises(UsageError, match="monitoring is true, false, or a mapping"):
        checker.check("yes", monitoring.VARS["monitoring"], "h.yml", "monitoring")
    with pytest.raises(UsageError, match="time span"):
        checker.check({"refresh": "1 minute"}, monitoring.VARS["monitoring"], "h.yml", "monitoring")
    # the directory goes into a unit's ExecStart and ReadWritePaths: refused as the inventory is read
    with pytest.raises(UsageError, match=r"h.yml: monitoring.textfile_dir: a textfile_dir is a plain absolute path"):
        checker.check({"textfile_dir": "/x ReadWritePaths=/"}, monitoring.VARS["monitoring"], "h.yml", "monitoring")


def test_a_server_started_before_its_files_changed_is_stale_drift_and_a_run_in_progress_says_so(tmp_path, monkeypatch):
    unit, _ = release(tmp_path, monkeypatch)
    monkeypatch.setattr(textfile, "unit_state", lambda name: {"ActiveState": "active", "NRestarts": "0",
                                                              "ExecMainStartTimestamp": unit.stat().st_mtime - 60})
    monkeypatch.setattr(textfile.lock, "peek", lambda: {"held": True, "expired": False})
    out = tmp_path / "tf"
    out.mkdir()
    textfile.write(protocol.Textfile(directory=str(out)))
    got = parse((out / "specops.prom").read_text())
    assert got[("specops_drift", frozenset({("service", "sglang"), ("kind", "stale")}))] == 1
    assert got[("specops_run_in_progress", frozenset())] == 1


def test_every_service_of_the_release_has_its_series(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch)
    import specops.agent.releases as rel
    path = tmp_path / "releases" / "20261206T120000.000000Z" / "manifest.json"
    m = json.loads(path.read_text())
    m["services"] = ["sglang", "router"]
    path.write_text(json.dumps(m))
    assert rel.current_manifest()["services"] == ["sglang", "router"]
    out = tmp_path / "tf"
    out.mkdir()
    textfile.write(protocol.Textfile(directory=str(out)))
    got = parse((out / "specops.prom").read_text())
    assert {dict(k[1])["service"] for k in got if k[0] == "specops_unit_active"} == {"sglang", "router"}


def test_a_temporary_name_someone_made_in_advance_is_never_written_through(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch)
    out, elsewhere = tmp_path / "tf", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.write_text("theirs")
    (out / f".specops.prom.{os.getpid()}.tmp").symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        textfile.write(protocol.Textfile(directory=str(out)))
    assert elsewhere.read_text() == "theirs" and not (out / "specops.prom").exists()


def test_status_never_writes_the_textfile():
    from types import SimpleNamespace
    from specops.flows import textfile as step
    run = SimpleNamespace(host={"monitoring": True}, opts=SimpleNamespace(check=True), epilogue=[])
    run.host = SimpleNamespace(get=lambda k: True)
    step.after(run)
    assert run.epilogue == []
    run.opts.check = False
    step.after(run)
    assert [r.directory for r in run.epilogue] == ["/var/lib/prometheus/node-exporter"]


def test_the_installed_sglang_is_asked_for_every_field_specops_intends():
    from sandbox.provision import sandbox_service
    from specops.sglang import resolver, spec
    assert set(spec.intended(sandbox_service())) <= set(resolver.FIELDS)


def test_a_unit_fact_this_agent_just_read_is_used_and_an_old_one_is_asked_again(monkeypatch):
    from specops.agent.converge import probe
    asked = []
    monkeypatch.setattr(textfile, "run_quiet",
                        lambda argv: asked.append(argv) or (0, "ActiveState=failed\nNRestarts=3\n"))
    monkeypatch.setitem(probe.SEEN, "sglang", (textfile.time.monotonic(), {"ActiveState": "active", "NRestarts": "0"}))
    assert textfile.unit_state("sglang")["ActiveState"] == "active" and asked == []
    monkeypatch.setitem(probe.SEEN, "sglang",
                        (textfile.time.monotonic() - textfile.FRESH_S - 1, {"ActiveState": "active"}))
    assert textfile.unit_state("sglang")["NRestarts"] == "3" and len(asked) == 1


def test_the_release_says_who_deployed_it_and_from_which_commits_and_an_older_one_does_not(tmp_path, monkeypatch):
    """Issue 46: specops_release_info's deployed_by, specops_commit and inventory_commit (12 hex
    digits, "+dirty" kept), escaped as every label is; a commit not recorded is no label."""
    out = tmp_path / "tf"
    out.mkdir()
    release(tmp_path, monkeypatch, provenance={"user": 'al"ice', "controller": "laptop",
                                               "checkout": "3f2a9c1d4e5f6a7b" + "0" * 24 + "+dirty"})
    textfile.write(protocol.Textfile(directory=str(out)))
    text = (out / "specops.prom").read_text()
    assert 'deployed_by="al\\"ice@laptop",specops_commit="3f2a9c1d4e5f+dirty"} 1.0' in text, text
    assert "inventory_commit" not in text
    release(tmp_path / "both", monkeypatch, provenance={"user": "alice", "controller": "laptop",
                                                        "inventory": "9e8d7c6b1a2b3c4d" + "0" * 24})
    textfile.write(protocol.Textfile(directory=str(out)))
    assert 'deployed_by="alice@laptop",inventory_commit="9e8d7c6b1a2b"} 1.0' in (out / "specops.prom").read_text()
    release(tmp_path / "older", monkeypatch)  # recorded before releases said who deployed them
    textfile.write(protocol.Textfile(directory=str(out)))
    (info,) = [k for k in parse((out / "specops.prom").read_text()) if k[0] == "specops_release_info"]
    assert sorted(dict(info[1])) == ["service", "sglang_version", "stamp", "venv", "weights_digest"]
