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
