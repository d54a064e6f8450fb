"""The hardened unit (specops/kinds/hardening.py) on a sandbox host: what systemd-analyze says
of it and of the same unit without it, that the sandboxing is in force on the running server, and
a service with `user:` through everything specops does around it."""
import re

import pytest

from sandbox.provision import sandbox_service
from specops.kinds.hardening import PROPERTIES
from support.files import load_json

pytestmark = pytest.mark.fleet
FAST = {"SGLANG_SIM_STARTUP_DELAY": "0"}
LOAD = ("--concurrency", "1", "--requests", "4", "--max-new-tokens", "16")
CAP_DAC_OVERRIDE, CAP_SYS_MODULE, CAP_SYS_ADMIN = 1, 16, 21


def exposure(h, unit: str) -> float:
    out = h.run("systemd-analyze", "security", "--no-pager", unit).stdout
    return float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))


def unhardened_exposure(h) -> float:
    """The deployed unit with the hardening's lines taken out, loaded under another name."""
    text = h.run("cat", "/etc/systemd/system/sglang.service").stdout
    plain = "\n".join(l for l in text.splitlines() if l.split("=", 1)[0] not in PROPERTIES)
    probe = "/run/systemd/system/specops-exposure-probe.service"
    h.run("sh", "-c", f"cat > {probe} && systemctl daemon-reload", input=plain + "\n")
    try:
        return exposure(h, "specops-exposure-probe.service")
    finally:
        h.run("sh", "-c", f"rm -f {probe} && systemctl daemon-reload")


def status_of(h, pid: int) -> dict:
    return dict(l.split(":\t", 1) for l in h.run("cat", f"/proc/{pid}/status").stdout.splitlines() if ":\t" in l)


def main_pid(h, unit="sglang") -> int:
    return int(h.run("systemctl", "show", unit, "-p", "MainPID", "--value").stdout)


@pytest.mark.security("hardened-unit", "the server's unit rated by `systemd-analyze security`, with and without "
                                       "specops' sandboxing; the sandboxing checked on the running server")
def test_the_unit_is_rated_5_or_lower_and_its_sandbox_holds_the_server(sandbox, record_property):
    h = sandbox.reset("t1")
    inv = sandbox.inventory({"t1": {"services": [sandbox_service(env=FAST)]}})
    res = sandbox.inv("deploy", "--host", "t1", inventory=inv)
    assert res.returncode == 0, res.stdout[-2000:]
    before, after = unhardened_exposure(h), exposure(h, "sglang.service")
    record_property("measured", f"`systemd-analyze security sglang.service`: {before} without the sandboxing, "
                                f"{after} with it")
    assert before >= 9.0 and after <= 5.0, (before, after)
    # In force on the server, not only written: no new privileges, a bounding set without module
    # loading, /usr read-only in its mount namespace.
    status = status_of(h, main_pid(h))
    assert status["NoNewPrivs"].strip() == "1"
    bounding = int(status["CapBnd"], 16)
    assert not bounding >> CAP_SYS_MODULE & 1 and bounding >> CAP_SYS_ADMIN & 1  # dropped; kept (profiling)
    mounts = h.run("cat", f"/proc/{main_pid(h)}/mountinfo").stdout.splitlines()
    usr = [m.split() for m in mounts if m.split()[4] == "/usr"]
    assert usr and "ro" in usr[-1][5].split(","), usr
    # What the score does not contain (docs/security.md): a root server keeps CAP_SYS_ADMIN and
    # CAP_DAC_OVERRIDE, and may write where cron reads and where D-Bus's socket is.
    effective = int(status["CapEff"], 16)
    assert effective >> CAP_DAC_OVERRIDE & 1 and effective >> CAP_SYS_ADMIN & 1
    for path in ("/var/spool/cron", "/run/dbus"):
        assert "rw" in covering(mounts, path)[5].split(","), path

    # A GPU node gone since boot (no persistence daemon made it): the sandboxed server could not
    # make it, the unit's privileged ExecStartPre does (nvidia-smi as root), and the server starts.
    h.run("rm", "/dev/nvidia0")
    h.run("systemctl", "restart", "sglang")
    invocation = h.run("systemctl", "show", "sglang", "-p", "InvocationID", "--value").stdout.strip()
    assert wait_ready(h, invocation), h.run("journalctl", "-u", "sglang", "-n", "20", "--no-pager").stdout
    assert h.run("stat", "-c", "%U:%G %a", "/dev/nvidia0").stdout.split() == ["root:video", "660"]


def covering(mountinfo: list[str], path: str) -> list[str]:
    """The mountinfo entry `path` is under: the longest mount point, the last mounted of equals."""
    entries = [m.split() for m in mountinfo]
    under = [e for e in entries if path == e[4] or path.startswith(e[4].rstrip("/") + "/")]
    return max(reversed(under), key=lambda e: len(e[4]))


def wait_ready(h, invocation: str, timeout: float = 30) -> bool:
    """Whether that run of the unit logs SGLang's ready line within `timeout` s."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = h.run("journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "--no-pager").stdout
        if "fired up and ready to roll" in log:
            return True
        time.sleep(0.3)
    return False


@pytest.mark.security("service-user", "a service with `user:`: made in the GPU nodes' group, then deployed twice, "
                                      "benched against its baseline, a GPU window, stopped; a person's account as "
                                      "the user; a GPU node no group opens")
def test_a_service_user_runs_everything_specops_does_around_it(sandbox, record_property):
    h = sandbox.reset("t2")
    svc = sandbox_service(env=FAST, user="sglang-svc")
    inv = sandbox.inventory({"t2": {"services": [svc]}})
    res = sandbox.inv("deploy", "--host", "t2", inventory=inv)
    assert res.returncode == 0, res.stdout[-2000:]
    assert "user sglang-svc (GPU device groups)" in res.stdout
    uid = h.run("id", "-u", "sglang-svc").stdout.strip()
    assert "video" in h.run("id", "-nG", "sglang-svc").stdout.split()  # the group of /dev/nvidia*
    assert status_of(h, main_pid(h))["Uid"].split()[0] == uid
    home = h.run("stat", "-c", "%U %a", "/var/lib/specops-home/sglang").stdout.split()
    assert home == ["sglang-svc", "700"]
    rated = exposure(h, "sglang.service")
    record_property("measured", f"`systemd-analyze security sglang.service` with the `user:`: {rated}")
    assert rated <= 5.0
    again = sandbox.inv("deploy", "--host", "t2", inventory=inv)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-2000:]

    report = sandbox.tmp / "bench.json"
    res = sandbox.inv("spec-bench", "--host", "t2", "--baseline", "--json", str(report), *LOAD, inventory=inv,
                      timeout=600)
    assert res.returncode == 0, res.stdout[-3000:]
    assert load_json(report)["hosts"]["t2"]["spec_bench"]["speedup"]["1"] > 0
    uids = h.run("journalctl", "-u", "specops-baseline-sglang", "-o", "verbose", "--no-pager").stdout
    assert f"_UID={uid}" in uids  # the baseline ran as the service's user

    res = sandbox.inv("gpu-window", "--host", "t2", "--", "nvidia-smi --query-compute-apps=pid --format=csv,noheader"
                      " | wc -l", inventory=inv)
    assert res.returncode == 0 and "| 0" in res.stdout and "sglang: ready after" in res.stdout, res.stdout[-2000:]
    res = sandbox.inv("stop", "--host", "t2", inventory=inv)
    assert res.returncode == 0 and "freed GPU 0" in res.stdout, res.stdout[-2000:]

    # An account specops did not make (a person's login) is never taken for a service's user.
    h.run("sh", "-c", "id alice >/dev/null 2>&1 || useradd -m alice")
    res = sandbox.inv("deploy", "--host", "t2",
                      inventory=sandbox.inventory({"t2": {"services": [dict(svc, user="alice")]}}))
    assert res.returncode != 0 and "user alice exists and is not one specops made" in res.stdout, res.stdout[-2000:]
    assert "video" not in h.run("id", "-nG", "alice").stdout.split()

    # A node no group opens (root:root 0660): refused before the unit changes, naming the node.
    h.run("chgrp", "root", "/dev/nvidia0")
    other = sandbox.inventory({"t2": {"services": [dict(svc, user="other-svc")]}})
    unit_before = h.run("sha256sum", "/etc/systemd/system/sglang.service").stdout
    res = sandbox.inv("deploy", "--host", "t2", inventory=other)
    assert res.returncode != 0
    assert "/dev/nvidia0 is root:root 660: user other-svc could not open it" in res.stdout, res.stdout[-2000:]
    assert h.run("sha256sum", "/etc/systemd/system/sglang.service").stdout == unit_before
