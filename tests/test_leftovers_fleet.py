"""Every process holding GPU memory accounted for: leftovers of earlier runs found and killed on
every restart path, stop failing on what it cannot attribute, status flagging it, and GPUs whose
memory nvidia-smi cannot report."""
import json
import time

import pytest

from sandbox.provision import sandbox_service
from support.files import load_json
from support.hosts import unit_prop

pytestmark = pytest.mark.fleet
ORPHANS = {"SGLANG_SIM_STARTUP_DELAY": "0", "SGLANG_SIM_ORPHAN": "escape"}


def run_inv(sandbox, inv, *args, **kw):
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    res = sandbox.inv(*args, "--json", str(report), inventory=inv, **kw)
    return res, (load_json(report)["hosts"] if report.exists() else None)


def apps(h) -> dict[int, int]:
    """pid → MiB, from the nvidia-smi stand-in (live processes only)."""
    out = h.run("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").stdout
    held: dict[int, int] = {}
    for line in out.splitlines():
        if line.strip():
            pid, mib = (int(x) for x in line.split(","))
            held[pid] = held.get(pid, 0) + mib
    return held


def schedulers(h) -> set[int]:
    out = h.run("pgrep", "-f", "^sglang::scheduler", check=False).stdout
    return {int(p) for p in out.split()}


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def deploy_with_orphans(sandbox, name, **over):
    h = sandbox.reset(name)
    inv = sandbox.inventory({name: {"services": [sandbox_service(env=ORPHANS, **over)]}})
    res, _ = run_inv(sandbox, inv, "deploy", "--host", name)
    assert res.returncode == 0, res.stdout
    assert wait_for(lambda: len(schedulers(h)) == 1)
    return h, inv


def test_stop_finds_the_retitled_orphan_of_an_earlier_run(sandbox):
    """Bug 1: the scheduler of an earlier run (retitled, outside the cgroup, its environ wiped by
    setproctitle) is recognised by stop and killed; so is the current run's."""
    h, inv = deploy_with_orphans(sandbox, "t1")
    (old,) = schedulers(h)
    h.run("systemctl", "restart", "sglang")  # by hand, as people do: the escaped scheduler survives
    assert wait_for(lambda: len(schedulers(h)) == 2)
    assert old in schedulers(h)
    assert h.run("cat", f"/proc/{old}/cmdline").stdout.startswith("sglang::scheduler")
    environ = h.run("python3", "-c", "import sys; print(set(open(sys.argv[1], 'rb').read()) <= {0})",
                    f"/proc/{old}/environ").stdout
    assert environ.strip() == "True"  # all NUL: no INVOCATION_ID to read
    assert "sglang.service" not in h.run("cat", f"/proc/{old}/cgroup").stdout

    res, _ = run_inv(sandbox, inv, "stop", "--host", "t1")
    assert res.returncode == 0, res.stdout
    assert f"killed leftover pid {old} (sglang::scheduler) with SIGKILL" in res.stdout
    assert apps(h) == {} and schedulers(h) == set()


@pytest.mark.logins
def test_every_restart_path_accounts_for_leftovers(sandbox):
    """Bug 2: deploy's restart handler, the undo of a failed deploy, rollback and the start after a
    GPU window each leave exactly the new run on the GPUs."""
    h, inv = deploy_with_orphans(sandbox, "t2")

    def only_the_current_run():
        held = apps(h)
        main = int(unit_prop(h, "sglang", "MainPID"))
        return len(schedulers(h)) == 1 and set(held) == {main} | schedulers(h) and sum(held.values()) == 2000

    first = schedulers(h)
    changed = sandbox.inventory({"t2": {"services": [sandbox_service(env={**ORPHANS, "NOTE": "2"})]}})
    res, _ = run_inv(sandbox, changed, "deploy", "--host", "t2")
    assert res.returncode == 0, res.stdout
    assert wait_for(only_the_current_run) and not first & schedulers(h), res.stdout

    second = schedulers(h)
    broken = sandbox.inventory({"t2": {"services": [sandbox_service(env={**ORPHANS, "NOTE": "3"}, port=99999)]}})
    res, rep = run_inv(sandbox, broken, "deploy", "--host", "t2")
    assert res.returncode == 1 and "rolled back" in rep["t2"]["notes"], res.stdout
    assert wait_for(only_the_current_run) and not second & schedulers(h), res.stdout

    third = schedulers(h)
    res, _ = run_inv(sandbox, changed, "rollback", "--host", "t2")
    assert res.returncode == 0, res.stdout
    assert wait_for(only_the_current_run) and not third & schedulers(h), res.stdout

    fourth = schedulers(h)
    h.run("systemctl", "restart", "sglang")  # an orphan of a run specops did not start
    assert wait_for(lambda: len(schedulers(h)) == 2)
    res = sandbox.inv("gpu-window", "--host", "t2", "--", "true", inventory=changed)
    assert res.returncode == 0, res.stdout
    assert wait_for(only_the_current_run) and not fourth & schedulers(h), res.stdout

    status = sandbox.inv("status", "--host", "t2", inventory=changed)
    assert status.returncode == 0 and "WARNING" not in status.stdout, status.stdout


FOREIGN = ("import json, os, sys, time\n"
           "open('/run/sglang-sim/gpu/%d.json' % os.getpid(), 'w').write(json.dumps("
           "{'pid': os.getpid(), 'gpus': [0], 'label': 'job', 'used_memory': 3000}))\n"
           "print('registered', flush=True)\n"
           "time.sleep(600)\n")


def test_stop_fails_naming_what_it_could_not_attribute_and_status_flags_it(sandbox):
    """Bug 3: someone else's process on the GPUs is never killed; stop exits 1 naming its pid and
    command line, and status flags memory held by no running service."""
    h = sandbox.reset("t3")
    inv = sandbox.inventory({"t3": {"services": [sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "0"})]}})
    res, _ = run_inv(sandbox, inv, "deploy", "--host", "t3")
    assert res.returncode == 0, res.stdout
    h.run("sh", "-c", "mkdir -p /run/sglang-sim/gpu && chmod 1777 /run/sglang-sim/gpu")
    h.run("systemd-run", "--unit", "someone-elses-job", "--uid", "nobody", "python3", "-c", FOREIGN)
    assert wait_for(lambda: 3000 in apps(h).values())
    job = next(pid for pid, mib in apps(h).items() if mib == 3000)

    status = sandbox.inv("status", "--host", "t3", inventory=inv)
    assert f"3000 MiB held by pid {job} (/usr/bin/python3 -c import json" in status.stdout, status.stdout
    assert "user nobody) that belongs to no running service" in status.stdout

    res, rep = run_inv(sandbox, inv, "stop", "--host", "t3")
    assert res.returncode == 1, res.stdout
    assert f"GPU memory still held by pid {job} (/usr/bin/python3 -c import json" in rep["t3"]["error"]
    assert "it belongs to no service specops runs here, so it was not killed" in rep["t3"]["error"]
    assert "1 compute app(s) left on the GPUs" in res.stdout
    assert h.run("test", "-d", f"/proc/{job}", check=False).returncode == 0  # not ours: left alone
    h.run("systemctl", "stop", "someone-elses-job")


def test_gpus_whose_memory_nvidia_smi_cannot_report(sandbox):
    """Bug 5: [N/A] and [Not Supported] (MIG, some drivers) are unknown, not a crash."""
    h = sandbox.reset("t4")
    h.path("/etc/specops-sim/gpus.json").write_text(json.dumps({"driver_version": "575.57.08", "gpus": [
        {"name": "NVIDIA H100 80GB HBM3", "memory_total": 81559},
        {"name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "memory_total": 40192, "memory_unreported": "[N/A]"},
        {"name": "NVIDIA H100 80GB HBM3", "memory_total": 81559, "memory_unreported": "[Not Supported]"}]}))
    svc = sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "0"}, cuda_visible_devices="0,1,2")
    inv = sandbox.inventory({"t4": {"services": [svc]}})
    res, _ = run_inv(sandbox, inv, "deploy", "--host", "t4")
    assert res.returncode == 0, res.stdout

    facts = json.loads(sandbox.inv("facts", "--host", "t4", inventory=inv).stdout)["t4"]["gpu"]
    assert [g["memory.used"] for g in facts["gpus"]] == [1000, None, None]
    assert ("GPU 1 memory.used ([N/A])" in facts["unknown"]
            and "GPU 2 memory.total ([Not Supported])" in facts["unknown"])
    status = sandbox.inv("status", "--host", "t4", inventory=inv)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "0:1000/81559MiB 1:?/?MiB 2:?/?MiB" in status.stdout
    assert "nvidia-smi does not report GPU 1 memory.used ([N/A])" in status.stdout

    res, _ = run_inv(sandbox, inv, "stop", "--host", "t4")
    assert res.returncode == 0, res.stdout
    assert "freed GPU 0: 1000 MiB" in res.stdout and "0 compute app(s) left" in res.stdout
