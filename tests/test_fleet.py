"""The sandbox fleet itself: leftovers of a killed run are swept, teardown leaves nothing."""
import os
import subprocess
from pathlib import Path

import pytest

from sandbox import cgroups, fleet

pytestmark = pytest.mark.fleet


def alive(pid: int) -> bool:
    """Running (this test started it: once killed, it is a zombie until reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def traces(site: fleet.Site) -> dict:
    """Everything of this site that could outlive a run."""
    netns = [l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                   text=True).stdout.splitlines()]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    mounts = Path("/proc/mounts").read_text()
    procs = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(site.state).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                procs.append(pid)
        except OSError:
            pass
    addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    groups = [g for top in cgroups.tops() if top.is_dir() for g in top.iterdir()
              if g.is_dir() and g.name.startswith(site.prefix + "-")]
    return {"cgroups": groups, "netns": [n for n in netns if n.startswith(site.prefix + "-")],
            "addresses": [a for a in addresses.splitlines() if f" {site.subnet}." in a],
            "veth": [l for l in links.splitlines() if f": {site.prefix}v" in l],
            "mounts": [m for m in mounts.splitlines() if str(site.state) in m],
            "procs": procs}


@pytest.mark.found("killed-run-leftovers")
def test_killed_run_leftovers_are_swept_and_teardown_is_clean(tmp_path):
    site = fleet.Site("sox", "192.168.232", Path("/var/lib/specops-sandbox-selftest"))
    try:
        abandoned = fleet.Fleet(["left"], site=site).up()
        fleet.service_address_up(site)
        old_pid = abandoned["left"].pid()
        # The run "dies" here: nothing is torn down, and the record of its container's process goes
        # too.  The next run must cope, from what the machine itself shows.
        (abandoned["left"].dir / "nspawn.pid").unlink()
        assert abandoned["left"].pid() is None and alive(old_pid)
        assert all(traces(site).values())
        f = fleet.Fleet(["left", "new"], site=site).up()
        assert f["left"].pid() != old_pid and not alive(old_pid)
        assert f["new"].run("hostname").stdout.strip() == "new"
        assert len(traces(site)["netns"]) == 2
    finally:
        fleet.sweep(site)
    assert traces(site) == {"cgroups": [], "netns": [], "addresses": [], "veth": [], "mounts": [], "procs": []}


def test_each_host_has_its_own_cgroup_tree(sandbox):
    """A unit of one name on two hosts is two cgroups, as on two real boxes: one host's systemd
    never sees, kills or removes the other's processes (shared, a stop on t1 failed to kill
    "control group ... Input/output error" and a start there died with 219/CGROUP)."""
    hosts = [sandbox.host("t1"), sandbox.host("t2")]
    try:
        for h in hosts:
            h.run("systemd-run", "--unit=cgprobe", "sleep", "300")
        for h in hosts:
            group = h.run("systemctl", "show", "-p", "ControlGroup", "--value", "cgprobe").stdout.strip()
            main = h.run("systemctl", "show", "-p", "MainPID", "--value", "cgprobe").stdout.strip()
            # cgroup2, as systemd reads it: a process of another PID namespace is listed as 0.
            hybrid = h.run("test", "-d", "/sys/fs/cgroup/unified", check=False).returncode == 0
            unified = "/sys/fs/cgroup/unified" if hybrid else "/sys/fs/cgroup"
            procs = h.run("cat", f"{unified}{group}/cgroup.procs").stdout.split()
            assert procs == [main], (h.name, group, procs)
    finally:
        for h in hosts:
            h.run("systemctl", "stop", "cgprobe", check=False)
