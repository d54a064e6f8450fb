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
    monkeypatch.setattr(gpus, "_ASKED", [])
    return log, boot


def asked(log):
    return len(log.read_text().splitlines()) if log.exists() else 0


def active(invocation):
    return {"sglang": {"ActiveState": "active", "InvocationID": invocation}}


def test_the_gpus_are_asked_again_only_when_no_run_that_held_them_is_still_running(tmp_path, monkeypatch):
    log, boot = kept_setup(tmp_path, monkeypatch)
    first = gpus.for_plan(["sglang"], active("run-a"))
    assert asked(log) == 1 and first["driver"] == "575.57.08" and "kept" not in first
    again = gpus.for_plan(["sglang"], active("run-a"))
    assert asked(log) == 1 and again["kept"] and again["gpus"] == first["gpus"]
    gpus.for_plan(["sglang"], active("run-b"))  # restarted by someone else: the driver may have changed
    assert asked(log) == 2
    gpus.for_plan(["sglang"], {"sglang": {"ActiveState": "inactive", "InvocationID": "run-b"}})
    assert asked(log) == 3  # stopped: nothing holds the GPUs
    gpus.for_plan(["sglang"], active("run-b"))
    boot.write_text("boot-2\n")
    gpus.for_plan(["sglang"], active("run-b"))
    assert asked(log) == 5  # rebooted


def test_a_run_this_agent_started_after_asking_holds_those_gpus(tmp_path, monkeypatch):
    log, _ = kept_setup(tmp_path, monkeypatch)
    gpus.started("run-x")  # asked nothing yet: a start proves nothing about the kept answer
    gpus.for_plan(["sglang"], {})
    assert asked(log) == 1
    gpus.started("run-y")  # the deploy's restart
    assert gpus.for_plan(["sglang"], active("run-y"))["kept"] and asked(log) == 1
    monkeypatch.setattr(gpus, "_ASKED", [])
    gpus.started("run-z")  # another agent, which asked nvidia-smi nothing
    gpus.for_plan(["sglang"], active("run-z"))
    assert asked(log) == 2


def test_verify_reads_the_unit_as_its_probe_did_until_something_changed_the_host(monkeypatch):
    import os
    import time
    from specops.agent import main
    from specops.agent.converge import probe
    asked = []
    monkeypatch.setattr(probe, "unit_fact", lambda name: asked.append(name) or {"ActiveState": "active"})
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
