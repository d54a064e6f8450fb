"""The sandbox fleet itself: many hosts on one machine, and a host that does not boot."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from sandbox import fleet, pkgindex, provision
from specops import inventory as inventory_mod
from specops.sglang import patchfile, stack

pytestmark = pytest.mark.fleet


def test_fifty_hosts_boot_when_the_inotify_limit_is_low(tmp_path, capfd):
    """Bug 7: each container's systemd holds inotify instances, all counted against root's limit
    (128 by default).  Measured without the fix: 26 of 50 hosts did not boot ("sshd did not answer
    within 60s").  The fleet raises the limit itself, and says so."""
    site = fleet.Site("sol", "192.168.236", tmp_path / "site")
    saved = fleet.INOTIFY.read_text()
    fleet.INOTIFY.write_text("128")
    many = fleet.Fleet([f"m{i}" for i in range(1, 51)], layers=[provision.layer("gpubox")], site=site)
    try:
        many.up()
        assert all(h.pid() for h in many.hosts)
        assert int(fleet.INOTIFY.read_text()) >= 128 + 16 * 50
        err = capfd.readouterr().err
        assert "raised fs.inotify.max_user_instances from 128 to" in err and "50 host(s) up" in err
        assert many["m50"].run("systemctl", "is-system-running", check=False).stdout.strip() in ("running", "degraded")
    finally:
        many.down()
        fleet.INOTIFY.write_text(saved)


def test_a_host_that_does_not_boot_is_one_line_with_its_console(tmp_path):
    broken = tmp_path / "broken-layer"
    init = broken / "usr/lib/systemd/systemd"
    init.parent.mkdir(parents=True)
    init.write_text("#!/bin/sh\necho 'init: cannot mount /proc: this host is broken on purpose'\nexit 1\n")
    init.chmod(0o755)
    site = fleet.Site("sok", "192.168.237", tmp_path / "site")
    f = fleet.Fleet(["k1"], layers=[broken], site=site)
    try:
        with pytest.raises(fleet.BootError) as e:
            f.up()
    finally:
        f.down()
    message = str(e.value)
    assert "\n" not in message and message.startswith("1 of 1 host(s) did not boot; first: k1:")
    assert "this host is broken on purpose" in message
    assert not Path(f"/run/netns/{site.prefix}-k1").exists()


def _inv(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    """The real CLI, as a user runs it (no fleet fixture: `inv sandbox.up` boots its own host)."""
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env}, stdin=subprocess.DEVNULL)


def _index_processes(address: str) -> list[int]:
    """Every process serving a package index on `address`, found on the machine, not by a pid file."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"sandbox.pkgindex serve {address} " in cmd:
            found.append(int(pid))
    return found


def readme_sandbox_steps() -> list[str]:
    """The commands of README.md's "Trying it on the sandbox", one a line, comments taken off."""
    text = (Path(ROOT) / "README.md").read_text()
    block = text.split("### Trying it on the sandbox", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    steps = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [s for s in steps if s and not s.startswith("#") and not s.startswith("I=")]


def resolve_docstring(merged: str) -> str:
    """What a person makes of the demo patch's conflict: 0.5.24's docstring, with the patch's line."""
    m = re.search(r'<<<<<<< [^\n]*\n(.*?)\|\|\|\|\|\|\| [^\n]*\n.*?=======\n(.*?)>>>>>>> [^\n]*\n', merged, re.S)
    ours, theirs = m.groups()
    note = ours.strip().splitlines()[-1]  # 'Patched: EAGLE-3 layer id -1 captures the embedding output."""'
    resolved = theirs.rstrip().removesuffix('"""') + "\n\n" + note + "\n"
    return merged[:m.start()] + resolved + merged[m.end():]


def running(h) -> tuple[str, str]:
    info = json.loads(h.run("curl", "-sf", "http://127.0.0.1:30000/model_info").stdout)
    return info["model_code"], info.get("model_code_version")


def test_sandbox_up_serves_the_package_index_its_stack_inventory_names_and_down_stops_it(tmp_path):
    """The README's 'Upgrading SGLang' on the sandbox, as a new user follows it: `inv sandbox.up`
    starts the site's package index (a process that outlives it) and says its versions; the
    inventory it writes puts the host on a stack (no `venv:`, SGLang pinned) built from that index;
    a second `sandbox.up` leaves the index alone; the upgrade its comment describes works; and
    `inv sandbox.down` stops the index and takes its address off lo."""
    site = fleet.Site("soi", "192.168.243", tmp_path / "site")
    env = {"SPECOPS_SANDBOX_SITE": f"{site.prefix},{site.subnet},{site.state}"}
    address = fleet.service_address(site)
    url = f"http://{address}:{pkgindex.PORT}"
    inv_dir = site.inventory_dir
    h = fleet.Host("sandbox", 1, site)
    pid = None
    try:
        up = _inv("sandbox.up", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"package index: {url}/simple" in up.stdout
        assert f"SGLang versions: {', '.join(provision.SIM_VERSIONS)}" in up.stdout
        assert f"{provision.SIM_FAILING} fails at start, on purpose" in up.stdout
        pid = pkgindex.recorded(site)
        assert pid and _index_processes(address) == [pid]
        # the index answers the host itself, over its veth, listing every release's wheel
        page = h.run("curl", "-sf", f"{url}/simple/sglang/").stdout
        for version in provision.SIM_VERSIONS:
            assert f">sglang-{version}-py3-none-any.whl<" in page, page
        # the inventory: a stack pinned to the preinstalled version, from that index; fla not pinned
        (host,) = inventory_mod.load(inv_dir).select("sandbox", None)
        assert "venv" not in host.vars and "fla" not in host.vars
        assert host["sglang"] == {"version": provision.SIM_VERSION} == {"version": "0.5.23"}
        assert host["torch"] == {"version": "2.9.1", "cuda": "auto", "index_url": f"{url}/whl/{{variant}}"}
        assert host["package_index"] == f"{url}/simple"
        assert stack.defines(host) is not None
        text = (inv_dir / "hosts.yml").read_text()
        assert f"# {', '.join(provision.SIM_VERSIONS)} (the simulator; {provision.SIM_FAILING} fails at start" in text
        assert "# To upgrade, change `sglang: {version: 0.5.23}` below (e.g. to 0.5.24), then" in text
        # the README's first command: a second `sandbox.up` (the index left running), then deploy
        first = _inv("sandbox.up", "deploy", "--inventory", str(inv_dir), "--host", "sandbox", env=env)
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
        assert "package index already running" in first.stderr and pkgindex.recorded(site) == pid
        recap = first.stdout.strip().splitlines()[-1]
        assert "failed=0" in recap and "sglang verified" in recap, first.stdout[-3000:]
        assert f"{stack.venv_of(host)}/bin/python" in h.path("/etc/systemd/system/sglang.service").read_text()
        info = json.loads(h.run("curl", "-sf", "http://127.0.0.1:30000/model_info").stdout)
        assert info["version"] == "0.5.23" and info["model_code"] == "patched: embedding capture"
        # README.md's "Trying it on the sandbox", step by step, as written
        steps = readme_sandbox_steps()
        hosts_yml, merge = inv_dir / "hosts.yml", inv_dir / "patches" / "srt/models/llama.py.merge-0.5.24"
        patch = inv_dir / "patches" / provision.DEMO_PATCH
        ran = 0
        for step in steps:
            if step.startswith("sed -i "):
                old, new = re.match(r"sed -i 's/version: (\S+)\$/version: (\S+)/' ", step).groups()
                text = hosts_yml.read_text()
                assert text.count(f"version: {old}\n") == 1, text
                hosts_yml.write_text(text.replace(f"version: {old}\n", f"version: {new}\n"))
                version = new
                continue
            if step.startswith("$EDITOR"):
                merged = merge.read_text()
                merge.write_text(resolve_docstring(merged))
                continue
            args = step.split()[1:]  # after .venv/bin/inv
            args = [a for a in args if a != "$I"]
            args[1:1] = ["--inventory", str(inv_dir), "--host", "sandbox"]
            args = [str(merge) if a.endswith("llama.py.merge-0.5.24") else a for a in args]
            res = _inv(*args, env=env)
            ran += 1
            out = res.stdout + res.stderr
            if "--check" in args:
                assert res.returncode == 1, out[-3000:]
                assert ("hunk 1 of 1 (@@ -1,10 +1,12 @@) does not apply to sglang 0.5.24's srt/models/llama.py "
                        "(cut from sglang 0.5.23); carry it onto sglang 0.5.24 with: inv patch --host sandbox "
                        "srt/models/llama.py --rebase") in out, out[-3000:]
                assert not h.path(stack.venv_of({**host.vars, "sglang": {"version": "0.5.24"}})).exists()
            elif "--rebase" in args:
                assert res.returncode == 1, out[-3000:]
                assert ("1 conflict(s) rebasing llama.py.patch from sglang 0.5.23 onto 0.5.24: hunk 1 of 1 "
                        "(@@ -1,10 +1,12 @@) against sglang 0.5.24's lines 1-4") in out, out[-3000:]
                assert f"Resolve them in {merge}" in out and "|||||||" in merge.read_text()
            elif "--edited" in args:
                assert res.returncode == 0, out[-3000:]
                assert patchfile.base_of(patch.read_text()).version == "0.5.24"
            elif args[0] == "deploy" and version == provision.SIM_FAILING:
                assert res.returncode == 1 and "ROLLING BACK" in out and "verified" in out, out[-3000:]
                assert running(h) == ("patched: embedding capture", "0.5.24")
            elif args[0] == "deploy":
                assert res.returncode == 0 and "sglang verified" in out, out[-3000:]
                assert running(h) == ("patched: embedding capture", "0.5.24")
                assert "hunk" not in out
            elif args[0] == "rollback":
                assert res.returncode == 0, out[-3000:]
                assert running(h) == ("patched: embedding capture", "0.5.23")
        assert ran == 6, steps  # every inv step of the README's was run, and checked
    finally:
        down = _inv("sandbox.down", env=env)
    assert down.returncode == 0 and "package index stopped" in down.stdout, down.stdout + down.stderr
    assert _index_processes(address) == []
    assert pid is None or not Path(f"/proc/{pid}").exists()
    assert address not in fleet.sh("ip", "-o", "addr", "show", "dev", "lo").stdout
    assert not (site.state / pkgindex.PID_FILE).exists() and not (inv_dir / "hosts.yml").exists()
