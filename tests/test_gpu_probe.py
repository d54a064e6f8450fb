"""What the probe asks nvidia-smi: the GPUs for every plan, their compute apps only when asked
(status and facts show them; a deploy's roles read only the GPUs).  No fleet: a logging
nvidia-smi on PATH."""
from specops import protocol
from specops.agent.services import gpus
from specops.flows.facts import base_wants
from specops.ops import merge_wants

SMI = """#!/bin/sh
echo "$@" >> {log}
case "$1" in
  --query-gpu=*) echo "0, GPU-1, NVIDIA H100, 575.57.08, 81559, 10" ;;
esac
"""


def fake_smi(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(SMI.format(log=log))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return log


def test_a_deploys_probe_asks_nvidia_smi_once(tmp_path, monkeypatch):
    log = fake_smi(tmp_path, monkeypatch)
    fact = gpus.gpu_fact(["sglang"], apps=False)
    assert [g["memory.total"] for g in fact["gpus"]] == [81559] and "apps" not in fact
    assert [line.split()[0] for line in log.read_text().splitlines()] == [
        "--query-gpu=index,uuid,name,driver_version,memory.total,memory.used"]


def test_status_asks_for_the_compute_apps_too(tmp_path, monkeypatch):
    log = fake_smi(tmp_path, monkeypatch)
    assert gpus.gpu_fact(["sglang"])["apps"] == []
    assert len(log.read_text().splitlines()) == 2
    assert base_wants(_host()).gpu_apps
    assert merge_wants([protocol.Probe(gpu=True), protocol.Probe(gpu=True, gpu_apps=True)]).gpu_apps


def _host():
    from specops.inventory import Host
    return Host(name="h", vars={"services": []})


def kept_setup(tmp_path, monkeypatch):
    from specops.agent import host
    log = fake_smi(tmp_path, monkeypatch)
    monkeypatch.setattr(host, "STATE_FILE", str(tmp_path / "state" / "state.json"))
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setattr(gpus, "BOOT_ID", str(boot))
    monkeypatch.setattr(gpus, "DRIVER", str(tmp_path / "driver-version"))
    monkeypatch.setattr(gpus, "_ASKED", [])
    return log, boot


def asked(log):
    return len(log.read_text().splitlines()) if log.exists() else 0


def active(invocation, unit="sglang"):
    return {unit: {"ActiveState": "active", "InvocationID": invocation}}


def plan(seen, record=True):
    return gpus.for_plan(["sglang"], seen, record)


def test_the_gpus_are_asked_again_only_when_no_run_that_held_them_is_still_running(tmp_path, monkeypatch):
    log, boot = kept_setup(tmp_path, monkeypatch)
    first = plan(active("run-a"))
    assert asked(log) == 1 and first["driver"] == "575.57.08" and "kept" not in first
    again = plan(active("run-a"))
    assert asked(log) == 1 and again["kept"] and again["gpus"] == first["gpus"]
    plan(active("run-b"))  # restarted by someone else: the driver may have changed meanwhile
    assert asked(log) == 2
    plan({"sglang": {"ActiveState": "inactive", "InvocationID": "run-b"}})
    assert asked(log) == 3  # stopped: nothing holds the GPUs
    plan(active("run-b"))
    boot.write_text("boot-2\n")
    plan(active("run-b"))
    assert asked(log) == 5  # rebooted
    (tmp_path / "driver-version").write_text("NVRM version: 580.1\n")
    plan(active("run-b"))
    assert asked(log) == 6  # another driver loaded
    plan(active("run-b"))
    assert asked(log) == 6


def test_only_sglangs_runs_hold_the_gpus_and_only_a_locked_probe_keeps_the_answer(tmp_path, monkeypatch):
    log, boot = kept_setup(tmp_path, monkeypatch)
    seen = {**active("router-run", unit="router"), **active("run-a")}
    plan(seen, record=False)
    plan(seen, record=False)  # --check: no lock, so nothing written
    assert asked(log) == 2 and "gpus" not in json_state(tmp_path)
    plan({**active("router-run", unit="router"), "sglang": {"ActiveState": "inactive"}})
    plan({**active("router-run", unit="router"), "sglang": {"ActiveState": "inactive"}})
    assert asked(log) == 4  # a router's run holds no GPU: it keeps nothing
    monkeypatch.setattr(gpus, "BOOT_ID", str(tmp_path / "no-boot-id"))
    plan(seen)
    plan(seen)
    assert asked(log) == 6  # without a boot id nothing is kept


def test_an_answer_that_failed_is_never_kept(tmp_path, monkeypatch):
    log, _ = kept_setup(tmp_path, monkeypatch)
    (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert "error" in plan(active("run-a"))
    assert "error" in plan(active("run-a")) and asked(log) == 2


def json_state(tmp_path):
    import json
    path = tmp_path / "state" / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_run_this_agent_started_after_asking_holds_those_gpus(tmp_path, monkeypatch):
    log, _ = kept_setup(tmp_path, monkeypatch)
    gpus.started("sglang", "run-x")  # asked nothing yet: a start proves nothing about the kept answer
    plan({})
    assert asked(log) == 1
    gpus.started("router", "run-r")  # not a unit the answer was kept for
    gpus.started("sglang", "run-y")  # the deploy's restart
    assert plan(active("run-y"))["kept"] and asked(log) == 1
    plan(active("run-r"))  # had the router's start been kept, this run would pass for one that held them
    assert asked(log) == 2
    monkeypatch.setattr(gpus, "_ASKED", [])
    gpus.started("sglang", "run-z")  # another agent, which asked nvidia-smi nothing
    plan(active("run-z"))
    assert asked(log) == 3


def test_verify_reads_the_unit_as_its_probe_did_until_something_changed_the_host(monkeypatch):
    import os
    import time
    from specops.agent import main
    from specops.agent.converge import probe
    asked = []
    monkeypatch.setattr(probe, "unit_fact", lambda name, reuse=False: asked.append(name) or {"ActiveState": "active"})
    monkeypatch.setattr(probe, "SEEN", {})
    probe.SEEN["sglang"] = (time.monotonic(), {"ActiveState": "active", "MainPID": str(os.getpid())})
    assert probe.recent_unit_fact("sglang")["MainPID"] == str(os.getpid()) and not asked
    main.answer('{"kind": "apply", "actions": []}')  # refused (no lock), but it was a change's request
    assert probe.SEEN == {}
    probe.recent_unit_fact("sglang")
    assert asked == ["sglang"]
    probe.SEEN["sglang"] = (time.monotonic(), {"ActiveState": "active", "MainPID": "0"})
    probe.recent_unit_fact("sglang")
    probe.SEEN["sglang"] = (time.monotonic() - 5, {"ActiveState": "active", "MainPID": str(os.getpid())})
    probe.recent_unit_fact("sglang")
    assert asked == ["sglang"] * 3


def test_verify_asks_systemd_again_for_a_unit_not_active_or_whose_main_process_is_gone(monkeypatch):
    import time
    from specops.agent.converge import probe
    asked = []
    monkeypatch.setattr(probe, "unit_fact", lambda name, reuse=False: asked.append(name) or {})
    monkeypatch.setattr(probe, "SEEN", {})
    gone = 4194304 + 7  # above pid_max's ceiling: no such process
    for fact in ({"ActiveState": "active", "MainPID": str(gone)}, {"ActiveState": "activating", "MainPID": "1"}):
        probe.SEEN["sglang"] = (time.monotonic(), fact)
        probe.recent_unit_fact("sglang")
    assert asked == ["sglang", "sglang"]
