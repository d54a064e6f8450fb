"""gpu_stack on bare sandbox hosts: torch for the driver, pins, no pip when right, air-gapped."""
import json
import time

import pytest

from sandbox import pkgindex, provision
from support.files import load_json

pytestmark = pytest.mark.fleet
VENV = provision.VENV
PIP_LOG = "/var/log/pip-calls.log"


def gpu_host(sandbox, name, driver="575.57.08", nvidia_smi=True):
    h = sandbox.reset(name, layers=[provision.layer("bare")])
    cfg = json.loads(h.path("/etc/specops-sim/gpus.json").read_text())
    h.path("/etc/specops-sim/gpus.json").write_text(json.dumps({**cfg, "driver_version": driver}))
    if not nvidia_smi:
        h.run("rm", "/usr/local/bin/nvidia-smi")
    assert not h.path(VENV).exists()
    return h


def stack(index, cuda="auto", **extra):
    return {"torch": {"version": "2.9.1", "cuda": cuda, "index_url": f"{index.url}/whl/{{variant}}"},
            "sglang": {"version": "0.5.23"}, "package_index": f"{index.url}/simple", **extra}


def deploy(sandbox, name, host_vars):
    inv = sandbox.inventory({name: host_vars})
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    res = sandbox.inv("deploy", "--host", name, "--json", str(report), inventory=inv, timeout=900)
    return res, (load_json(report)["hosts"][name] if report.exists() else None)


def in_venv(h, code):
    return json.loads(h.run(f"{VENV}/bin/python", "-c", f"import json, torch, sglang\n{code}").stdout)


def count_pip_calls(h):
    """Log every pip invocation in the venv, on the host: pip's package logs its argv on import."""
    init = h.run(f"{VENV}/bin/python", "-c", "import pip, os; print(pip.__file__)").stdout.strip()
    text = h.path(init).read_text()
    h.path(init).write_text(f"import sys as _s\nopen({PIP_LOG!r}, 'a').write(repr(_s.argv) + '\\n')\n" + text)
    h.run("rm", "-f", PIP_LOG)


def pip_calls(h):
    log = h.path(PIP_LOG)
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.reliability("second-run", "idempotence")
def test_driver_575_auto_picks_cu128_and_replaces_cpu_torch(sandbox, pkg_index):
    h = gpu_host(sandbox, "t1", driver="575.57.08")
    res, report = deploy(sandbox, "t1", stack(pkg_index, cuda="cpu"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert in_venv(h, "print(json.dumps([torch.__version__, torch.version.cuda]))") == ["2.9.1+cpu", None]

    res, report = deploy(sandbox, "t1", stack(pkg_index, cuda="auto"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert ("packages in /opt/sglang/venv (torch cu128): changed (torch 2.9.1+cpu (cuda None) → 2.9.1+cu128)"
            in res.stdout)
    got = in_venv(h, "print(json.dumps([torch.__version__, torch.version.cuda, torch.cuda.is_available(), "
                     "sglang.__version__]))")
    assert got == ["2.9.1+cu128", "12.8", True, "0.5.23"]
    assert "| " in res.stdout and "s Installing collected packages" in res.stdout  # pip progress, with elapsed time

    count_pip_calls(h)
    res, report = deploy(sandbox, "t1", stack(pkg_index, cuda="auto"))
    assert res.returncode == 0 and report["changed"] == 0, res.stdout
    assert pip_calls(h) == []
    # The counter does count: a real change makes exactly one pip call.
    res, _ = deploy(sandbox, "t1", stack(pkg_index, cuda="cu126"))
    assert res.returncode == 0 and len(pip_calls(h)) == 1
    assert in_venv(h, "print(json.dumps(torch.version.cuda))") == "12.6"


def test_driver_535_picks_cu121_and_says_there_is_no_wheel(sandbox, pkg_index):
    gpu_host(sandbox, "t2", driver="535.183.01")
    res, report = deploy(sandbox, "t2", stack(pkg_index))
    assert res.returncode == 1
    assert "(torch cu121)" in res.stdout
    assert "No matching distribution found for torch==2.9.1+cu121" in report["error"]
    assert "\n" not in report["error"]


def test_auto_without_nvidia_smi_is_one_line_naming_the_host(sandbox, pkg_index):
    gpu_host(sandbox, "t3", nvidia_smi=False)
    res, report = deploy(sandbox, "t3", stack(pkg_index))
    assert res.returncode == 1
    assert report["error"].startswith("t3: torch cuda is auto, but the host has no nvidia-smi")
    assert "\n" not in report["error"]


def test_gpu_facts(sandbox):
    gpu_host(sandbox, "t4", driver="575.57.08")
    gpu_host(sandbox, "t5", nvidia_smi=False)
    inv = sandbox.inventory({"t4": {}, "t5": {}})
    res = sandbox.inv("facts", "--all", inventory=inv)
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)
    gpu = facts["t4"]["gpu"]
    assert gpu["present"] and gpu["driver"] == "575.57.08" and len(gpu["gpus"]) == 4
    assert gpu["gpus"][0]["memory.total"] == 81559 and gpu["apps"] == []
    assert facts["t5"]["gpu"] == {"present": False}


@pytest.mark.slow
def test_air_gapped_real_cpu_torch_and_fla(sandbox):
    """The real torch 2.13.0 (CPU) and flash-linear-attention 0.6.0 from a pushed wheelhouse."""
    h = gpu_host(sandbox, "t5")
    wheelhouse = pkgindex.real_wheels()
    host_vars = {"torch": {"version": "2.13.0", "cuda": "cpu"}, "fla": {"version": "0.6.0"},
                 "wheelhouse": str(wheelhouse)}
    res, report = deploy(sandbox, "t5", host_vars)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    total = sum(w.stat().st_size for w in wheelhouse.glob("*.whl"))
    assert report["bytes_pushed"] == total and total > 190 * 2**20
    assert "push torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl:" in res.stdout and "MiB" in res.stdout
    out = h.run(f"{VENV}/bin/python", "-c", "import torch, fla; print(torch.__version__, fla.__version__)")
    assert out.stdout.split() == ["2.13.0+cpu", "0.6.0"]

    count_pip_calls(h)
    res, report = deploy(sandbox, "t5", host_vars)
    assert res.returncode == 0 and report["changed"] == 0, res.stdout
    assert report["bytes_pushed"] == 0 and pip_calls(h) == []
