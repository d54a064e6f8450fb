"""The SGLang service role and verify, on sandbox hosts running the SGLang simulator."""
import json
import time

import pytest

from roles import sglang_service
from sandbox.provision import sandbox_service
from support.files import load_json
from support.hosts import host_snapshot, sha256_on, unit_prop
from support.reliability import record_inputs

pytestmark = pytest.mark.fleet
SEED = {"algorithm": "EAGLE3", "draft_model_path": "/models/tiny-llama-eagle3",
        "num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 16}


def deploy(sandbox, name, services, *args, tmp_path=None):
    inv = sandbox.inventory({name: {"services": services}})
    report = (tmp_path or sandbox.tmp) / f"deploy-{time.monotonic_ns()}.json"
    res = sandbox.inv("deploy", "--host", name, "--json", str(report), *args, inventory=inv)
    return res, (load_json(report) if report.exists() else None)


def test_seed_case_with_opt_in_deploys_and_verify_reads_effective_value(sandbox):
    sandbox.reset("t1")
    svc = sandbox_service(speculative=SEED, allow_sglang_adjustments=True)
    res, report = deploy(sandbox, "t1", [svc])
    assert res.returncode == 0, res.stdout + res.stderr
    assert ("num_draft_tokens (speculative_num_draft_tokens): intended 16, effective 2 (accepted SGLang adjustment)"
            in res.stdout)
    (verified,) = report["hosts"]["t1"]["verify"]
    assert verified["effective"]["speculative_num_draft_tokens"] == 2  # read from /server_info
    assert verified["failures"] == []


def test_preflight_refuses_before_restart(sandbox, monkeypatch):
    """A static table that lets the seed's case through (say, out of date for the installed
    SGLang) is caught on the host by SGLang's own resolver, before anything changes."""
    h = sandbox.reset("t2")
    res, _ = deploy(sandbox, "t2", [sandbox_service()])
    assert res.returncode == 0, res.stdout + res.stderr
    files = ["/etc/systemd/system/sglang.service", "/etc/specops/sglang.env"]
    before = sha256_on(h, *files)
    started = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic")

    import specops.sglang.rules
    monkeypatch.setattr(specops.sglang.rules, "check_service", lambda svc, where: None)
    inv = sandbox.inventory({"t2": {"services": [sandbox_service(speculative=SEED, env_secret={"X": "changed"})]}})
    reports, out = sandbox.apply(inv, [sglang_service])
    err = reports[0].error
    assert err and "host preflight (the installed SGLang's own resolver) refuses sglang" in err, out
    assert "num_draft_tokens (speculative_num_draft_tokens): intended 16, effective 2" in err
    assert sha256_on(h, *files) == before
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") == started
    assert unit_prop(h, "sglang", "ActiveState") == "active"


def test_verify_waits_for_slow_startup(sandbox):
    sandbox.reset("t3")
    res, report = deploy(sandbox, "t3", [sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "20"})])
    assert res.returncode == 0, res.stdout + res.stderr
    (v,) = report["hosts"]["t3"]["verify"]
    assert 503 in v["health_statuses"] and v["health_statuses"][-1] == 200
    assert v["ready_after"] >= 15  # of a 20 s start: verify waited (slack for a loaded 2-core machine)
    assert "starting (/health: 503)" in res.stdout and "elapsed" in res.stdout


def test_server_exit_fails_verify_fast_with_journal(sandbox):
    h = sandbox.reset("t4")
    # The model is there but its config.json is not JSON: the server dies reading it (a missing
    # model is refused before the unit is touched, see test_missing_weights_...).
    h.run("mkdir", "-p", "/models/broken")
    h.path("/models/broken/config.json").write_text("{not json")
    svc = sandbox_service(model_path="/models/broken")
    svc.pop("speculative")  # no draft: nothing of specops's reads the target's config
    res, report = deploy(sandbox, "t4", [svc])
    finished = time.time()
    assert res.returncode == 1
    (v,) = report["hosts"]["t4"]["verify"]
    assert "the server exited" in v["failures"][0]
    assert "JSONDecodeError" in v["journal"]
    assert "journal tail:" in res.stdout
    exits = h.run("journalctl", "-u", "sglang", "-o", "short-unix", "--no-pager").stdout
    first_exit = float(next(l for l in exits.splitlines() if "Main process exited" in l).split()[0])
    # Fast means well before the 600 s timeout and before systemd's second restart (RestartSec=5).
    assert finished - first_exit <= 15, f"verify took {finished - first_exit:.1f}s after the exit"


@pytest.mark.reliability("secrets", "bad-input")
def test_secrets_appear_only_in_the_env_file(sandbox, tmp_path, record_property):
    h = sandbox.reset("t5")
    token, key = "hf_SECRETtoken123", "sk-SECRETkey456"
    record_inputs(record_property, "an HF_TOKEN in env_secret", "an api_key")
    svc = sandbox_service(env_secret={"HF_TOKEN": token}, api_key=key)
    outputs = []
    for args in (["--check"], [], ["--check", "--diff"]):
        res, report = deploy(sandbox, "t5", [svc], *args, tmp_path=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        outputs += [res.stdout, res.stderr, json.dumps(report)]
    inv = sandbox.inventory({"t5": {"services": [svc]}})
    verified = sandbox.inv("verify", "--host", "t5", inventory=inv)
    assert verified.returncode == 0, verified.stdout  # /v1/models etc. need the Bearer key
    outputs += [verified.stdout, verified.stderr]
    outputs.append(h.path("/etc/systemd/system/sglang.service").read_text())
    outputs.append(h.run("journalctl", "--no-pager", "-o", "cat").stdout)
    for text in outputs:
        assert token not in text and key not in text
    env = h.path("/etc/specops/sglang.env")
    assert h.run("stat", "-c", "%a", "/etc/specops/sglang.env").stdout.strip() == "600"
    assert token in env.read_text() and key in env.read_text()
    assert h.run("stat", "-c", "%a", "/etc/systemd/system/sglang.service").stdout.strip() == "644"


def test_two_services_on_one_host(sandbox):
    h = sandbox.reset("t1")
    services = [sandbox_service(name="sglang-a", port=30000, cuda_visible_devices="0,1"),
                sandbox_service(name="sglang-b", port=30001, cuda_visible_devices="2,3",
                                served_model_name="tiny-b")]
    res, report = deploy(sandbox, "t1", services)
    assert res.returncode == 0, res.stdout + res.stderr
    verified = {v["name"]: v for v in report["hosts"]["t1"]["verify"]}
    assert set(verified) == {"sglang-a", "sglang-b"} and not any(v["failures"] for v in verified.values())
    assert "/v1/models: tiny-b" in res.stdout and "/v1/models: tiny-llama" in res.stdout
    gpus = h.run("nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits").stdout
    assert [int(l.split(",")[1]) for l in gpus.splitlines()] == [1000, 1000, 1000, 1000]


@pytest.mark.logins
@pytest.mark.reliability("second-run", "idempotence")
@pytest.mark.found("stale-start-stamps")  # a deploy writes and restarts within one second: no stale code seen
def test_second_deploy_changes_nothing_and_does_not_restart(sandbox):
    h = sandbox.reset("t2")
    res, _ = deploy(sandbox, "t2", [sandbox_service()])
    assert res.returncode == 0
    before = host_snapshot(h)
    res, report = deploy(sandbox, "t2", [sandbox_service()])
    assert res.returncode == 0 and report["hosts"]["t2"]["changed"] == 0
    assert host_snapshot(h) == before
    assert report["hosts"]["t2"]["round_trips"] == 2  # one probe, one verify


def test_check_mode_runs_the_preflight_for_real(sandbox, tmp_path):
    """Bug 4: --check used to print "preflight sglang: ok" without running it; a flag the installed
    SGLang refuses now fails the check, and a good change says the preflight passed."""
    h = sandbox.reset("t3")
    res, _ = deploy(sandbox, "t3", [sandbox_service()])
    assert res.returncode == 0, res.stdout
    files = ["/etc/systemd/system/sglang.service", "/etc/specops/sglang.env"]
    before, started = sha256_on(h, *files), unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic")

    res, _ = deploy(sandbox, "t3", [sandbox_service(extra_args=["--bogus-flag"])], "--check")
    assert res.returncode == 1, res.stdout
    assert "check failed: host preflight: the installed SGLang refuses these arguments" in res.stdout
    assert "argparse error: unrecognized arguments: --bogus-flag" in res.stdout and "passed" not in res.stdout
    res, _ = deploy(sandbox, "t3", [sandbox_service(tp=2)], "--check")
    assert res.returncode == 0, res.stdout
    assert "check           preflight sglang: the installed SGLang resolves the new arguments: passed" in res.stdout
    assert sha256_on(h, *files) == before and len(before) == 2
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") == started


def test_missing_weights_are_named_before_the_unit_is_touched(sandbox):
    h = sandbox.reset("t2")
    res, rep = deploy(sandbox, "t2", [sandbox_service(model_path="/models/not-here")])
    error = rep["hosts"]["t2"]["error"]
    assert res.returncode == 1
    assert "model_path /models/not-here has no config.json on the host" in error, error
    assert not h.path("/etc/systemd/system/sglang.service").exists()
    assert not h.path("/etc/specops/sglang.env").exists()


def reloads(h) -> int:
    """How many times systemd (PID 1) reloaded: it logs "Reloading." for each."""
    out = h.run("journalctl", "_PID=1", "-o", "cat", "--no-pager", check=False).stdout
    return sum(1 for line in out.splitlines() if line.strip() == "Reloading.")


def test_a_new_unit_needs_no_daemon_reload_a_changed_one_gets_it(sandbox):
    """systemd loads a unit file it has not seen when asked for it; a changed one needs a reload.
    (Seen red with the reload always skipped: no reload counted.  The server still ran tp 2 then,
    as systemd unloads a stopped unit and reads it again on start: the count is the oracle.)"""
    h = sandbox.reset("t1")
    before = reloads(h)
    res, _ = deploy(sandbox, "t1", [sandbox_service()])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "daemon-reload: not needed, systemd has sglang as written" in res.stdout
    assert reloads(h) == before
    assert unit_prop(h, "sglang", "NeedDaemonReload") == "no"

    res, report = deploy(sandbox, "t1", [sandbox_service(tp=2)])
    assert res.returncode == 0, res.stdout + res.stderr
    (verified,) = report["hosts"]["t1"]["verify"]
    assert verified["effective"]["tp_size"] == 2  # the server runs the changed unit's arguments
    assert reloads(h) == before + 1 and "not needed" not in res.stdout


def test_a_no_op_asks_systemd_nothing_and_still_sees_a_unit_disabled_behind_its_back(sandbox):
    """The probe reuses the unit's fact kept from the last show (agent/services/unitkeep.py) while
    its run, its files and what enables it are as they were: a no-op spawns no systemctl.  A
    `systemctl disable` made by hand moves a .wants directory: the next deploy asks systemd,
    sees it and enables the unit again; one made with --no-reload, at systemd's next reload.  (A
    systemctl on PATH before systemd's counts the calls.)"""
    h = sandbox.reset("t3")
    res, _ = deploy(sandbox, "t3", [sandbox_service()])
    assert res.returncode == 0, res.stdout + res.stderr
    h.run("sh", "-c", "printf '#!/bin/sh\\necho \"$*\" >> /run/systemctl.calls\\nexec /usr/bin/systemctl \"$@\"\\n' "
          "> /usr/local/bin/systemctl && chmod 755 /usr/local/bin/systemctl")
    try:
        time.sleep(0.2)  # past a clock tick after the unit's files were written
        res, report = deploy(sandbox, "t3", [sandbox_service()])  # the show is kept at the latest here
        assert res.returncode == 0 and report["hosts"]["t3"]["changed"] == 0, res.stdout + res.stderr
        h.run("rm", "-f", "/run/systemctl.calls")
        res, report = deploy(sandbox, "t3", [sandbox_service()])
        assert res.returncode == 0 and report["hosts"]["t3"]["changed"] == 0, res.stdout + res.stderr
        calls = h.run("cat", "/run/systemctl.calls", check=False).stdout
        assert calls == "", calls
        h.run("/usr/bin/systemctl", "disable", "--quiet", "sglang")
        res, report = deploy(sandbox, "t3", [sandbox_service()])
        assert res.returncode == 0 and report["hosts"]["t3"]["changed"] >= 1, res.stdout + res.stderr
        assert "show sglang" in h.run("cat", "/run/systemctl.calls").stdout
        assert h.run("/usr/bin/systemctl", "is-enabled", "sglang").stdout.strip() == "enabled", res.stdout
        res, report = deploy(sandbox, "t3", [sandbox_service()])
        assert res.returncode == 0 and report["hosts"]["t3"]["changed"] == 0, res.stdout + res.stderr
        # Disabled without a reload: PID 1 still says enabled, and its answer is kept as the files
        # are now; a reload later changes its answer, and the next deploy sees it (the generators'
        # directory systemd makes anew on every reload is in the witness).
        h.run("/usr/bin/systemctl", "disable", "--quiet", "--no-reload", "sglang")
        time.sleep(0.2)
        res, report = deploy(sandbox, "t3", [sandbox_service()])
        assert res.returncode == 0 and report["hosts"]["t3"]["changed"] == 0, res.stdout + res.stderr
        h.run("/usr/bin/systemctl", "daemon-reload")
        res, report = deploy(sandbox, "t3", [sandbox_service()])
        assert res.returncode == 0 and report["hosts"]["t3"]["changed"] >= 1, res.stdout + res.stderr
        assert h.run("/usr/bin/systemctl", "is-enabled", "sglang").stdout.strip() == "enabled", res.stdout
    finally:
        h.run("rm", "-f", "/usr/local/bin/systemctl", "/run/systemctl.calls")
