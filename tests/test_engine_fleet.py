"""The engine against real hosts: real SSH, real files, real systemd."""
import json
import threading
import time

import pytest

from specops.ops import File, Service
from roles import VOCABULARY
from support import ROOT
from support.files import load_json
from support.hosts import host_snapshot, sha256_on, unit_prop
from support.reliability import record_bytes, record_inputs
from support.site import role

pytestmark = pytest.mark.fleet


def test_two_notifications_one_restart(sandbox):
    """Env file and unit both change: systemd shows exactly one new start."""
    h = sandbox.reset("t3")
    svc = {"name": "sglang", "model_path": "/models/tiny-llama", "port": 30000,
           "env": {"SGLANG_SIM_STARTUP_DELAY": "0"}}
    inv = sandbox.inventory({"t3": {"services": [svc]}})
    from roles import sglang_service
    r, out = sandbox.apply(inv, [sglang_service])
    assert r[0].error is None, out
    cursor = h.run("journalctl", "-n", "0", "--show-cursor", "-q").stdout.strip().split("cursor: ")[-1]
    start_before = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic")

    svc2 = {**svc, "env_secret": {"HF_TOKEN": "hf_secret_value_123"}, "tp": 1}
    inv = sandbox.inventory({"t3": {"services": [svc2]}})
    r, out = sandbox.apply(inv, [sglang_service])
    assert r[0].error is None, out
    changed = [c["target"] for c in r[0].changes if c["changed"]]
    assert changed == ["/etc/specops/sglang.env", "/etc/systemd/system/sglang.service"], out
    assert out.count("handler: restart sglang") == 1
    starts = h.run("journalctl", "-u", "sglang", "--after-cursor", cursor, "-o", "cat").stdout
    assert starts.count("Started sglang.service") == 1, starts
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") != start_before
    assert unit_prop(h, "sglang", "NRestarts") == "0"
    assert "hf_secret_value_123" not in out


@pytest.mark.reliability("ssh-cut", "fault")
def test_interrupted_write_leaves_old_file(sandbox, record_property):
    """Kill the SSH session while the new content sits staged: the old file survives."""
    h = sandbox.reset("t4")
    h.run("sh", "-c", "mkdir -p /srv/demo && echo old > /srv/demo/victim")
    inv = sandbox.inventory({"t4": {}})
    slow = ["/bin/sh", "-c", "sleep 30", "validator", "{}"]
    results = {}

    def run():
        results["r"] = sandbox.apply(inv, [role("w", lambda host: [
            File("/srv/demo/victim", "new\n", validate=slow)])])

    t = threading.Thread(target=run)
    t.start()
    old = sha256_on(h, "/srv/demo/victim")

    def staged():
        return list(h.path("/srv/demo").glob(".specops-stage-*/victim"))
    deadline = time.monotonic() + 20
    while not staged() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert staged(), "the write never reached its staging file"
    h.run("pkill", "-KILL", "-f", "sshd: root@notty")  # cut the connection
    t.join(30)
    reports, out = results["r"]
    record_bytes(record_property, h, old)
    assert reports[0].error, out
    assert h.path("/srv/demo/victim").read_text() == "old\n"
    deadline = time.monotonic() + 5
    while list(h.path("/srv/demo").glob(".specops-stage-*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the agent cleans up on SIGTERM
    assert not list(h.path("/srv/demo").glob(".specops-stage-*"))
    again, out = sandbox.apply(inv, [role("w", lambda host: [File("/srv/demo/victim", "new\n")])])
    assert again[0].error is None and h.path("/srv/demo/victim").read_text() == "new\n"


@pytest.mark.reliability("ssh-cut", "fault")
def test_ssh_cut_between_two_renames_is_said_and_converges(sandbox, record_property):
    """A switch cut between its renames leaves the host part-new; the next run says exactly what
    the cut run had done, began and had not, undoes it first, then converges.  (Seen red before
    the batch journal: the next run converged silently; and before issue 45, when it converged
    without undoing.)"""
    h = sandbox.reset("t4")
    h.run("sh", "-c", "mkdir -p /srv/demo && echo old > /srv/demo/a && echo old > /srv/demo/b")
    inv = sandbox.inventory({"t4": {}})

    def batch(host, pause=True):  # a oneshot unit's start blocks the switch between the renames
        between = [File("/etc/systemd/system/demo-pause.service", "[Service]\nType=oneshot\nExecStart=/bin/sleep 30\n"),
                   Service("demo-pause", enabled=None)] if pause else []
        return [File("/srv/demo/a", "new\n"), *between, File("/srv/demo/b", "new\n")]
    results = {}
    b_before = sha256_on(h, "/srv/demo/b")
    t = threading.Thread(target=lambda: results.update(r=sandbox.apply(inv, [role("w", batch)])))
    t.start()
    deadline = time.monotonic() + 20
    while not h.run("pgrep", "-f", "/bin/sleep 30", check=False).stdout and time.monotonic() < deadline:
        time.sleep(0.1)
    h.run("pkill", "-KILL", "-f", "sshd: root@notty")
    t.join(30)
    assert results["r"][0][0].error
    record_bytes(record_property, h, b_before)  # b, not yet renamed when the cut came, is intact
    assert (h.path("/srv/demo/a").read_text(), h.path("/srv/demo/b").read_text()) == ("new\n", "old\n")

    again, out = sandbox.apply(inv, [role("w", lambda host: batch(host, False))])
    assert again[0].error is None, out
    assert ("WARNING: an earlier run (task run) was cut off in the middle of its switch: done: update /srv/demo/a, "
            "create /etc/systemd/system/demo-pause.service; cut off at: start demo-pause; not done: update "
            "/srv/demo/b; undone before this run: 2 file(s) put back") in out, out
    assert (h.path("/srv/demo/a").read_text(), h.path("/srv/demo/b").read_text()) == ("new\n", "new\n")
    assert not h.path("/etc/systemd/system/demo-pause.service").exists()  # what the cut run made is gone
    third, out = sandbox.apply(inv, [role("w", lambda host: batch(host, False))])
    assert "cut off" not in out


@pytest.mark.reliability("host-key", "bad-input")
def test_host_keys_unknown_accept_new_changed(sandbox, tmp_path, record_property):
    record_inputs(record_property, "an unknown host key", "a changed host key")
    h = sandbox.reset("t5")
    known = tmp_path / "known_hosts"
    known.write_text("")
    inv = sandbox.inventory({"t5": {"known_hosts": str(known)}})
    facts = ["facts", "--host", "t5"]

    refused = sandbox.inv(*facts, inventory=inv)
    assert refused.returncode != 0
    assert "unknown host key ssh-ed25519 SHA256:" in refused.stdout + refused.stderr
    assert "--accept-new-host-key" in refused.stdout + refused.stderr
    assert known.read_text() == ""

    accepted = sandbox.inv(*facts, "--accept-new-host-key", inventory=inv)
    assert accepted.returncode == 0, accepted.stderr
    assert h.host_key_pub in known.read_text()
    assert sandbox.inv(*facts, inventory=inv).returncode == 0  # recorded key is used later

    # Rebuild the host's identity: the recorded key no longer matches.
    h.run("sh", "-c", "rm -f /etc/ssh/ssh_host_ed25519_key* && ssh-keygen -q -t ed25519 -N '' "
                      "-f /etc/ssh/ssh_host_ed25519_key && systemctl restart ssh")
    changed = sandbox.inv(*facts, "--accept-new-host-key", inventory=inv)
    assert changed.returncode != 0
    assert "host key CHANGED" in changed.stdout + changed.stderr


@pytest.mark.reliability("second-run", "idempotence")
def test_cli_deploy_twice_and_facts(sandbox, tmp_path):
    h = sandbox.reset("t2")
    from sandbox.provision import sandbox_service
    inv = sandbox.inventory({"t2": {"services": [sandbox_service()]}})
    first = sandbox.inv("deploy", "--host", "t2", "--json", str(tmp_path / "1.json"), inventory=inv)
    assert first.returncode == 0, first.stdout + first.stderr
    assert load_json(tmp_path / "1.json")["hosts"]["t2"]["changed"] == 6  # + the launcher and its directory
    before = host_snapshot(h)
    second = sandbox.inv("deploy", "--host", "t2", "--json", str(tmp_path / "2.json"), inventory=inv)
    assert second.returncode == 0
    rep = load_json(tmp_path / "2.json")["hosts"]["t2"]
    assert rep["changed"] == 0 and rep["status"] == "ok"
    assert "changed=0" in second.stdout
    assert host_snapshot(h) == before
    assert unit_prop(h, "sglang", "ActiveState") == "active"

    facts = sandbox.inv("facts", "--host", "t2", inventory=inv)
    assert facts.returncode == 0, facts.stderr
    data = json.loads(facts.stdout)["t2"]
    assert data["units"]["sglang"]["ActiveState"] == "active"
    assert data["venvs"]["/opt/sglang/venv"]["packages"]["sglang"] == "0.5.23"
    assert data["gpu"]["present"] and data["gpu"]["driver"] == "575.57.08"


@pytest.mark.reliability("unreachable", "fault")
def test_unreachable_host_fails_alone(sandbox, tmp_path):
    sandbox.reset("t1")
    # Loopback, closed port: unreachable without sending a packet off this machine.
    inv = sandbox.inventory({"t1": {}, "ghost": {"address": "127.0.0.1", "ssh_port": 9, "connect_timeout": 2}})
    res = sandbox.inv("facts", "--all", inventory=inv)
    assert res.returncode == 1
    assert "failed hosts: ghost" in res.stderr
    assert list(json.loads(res.stdout)) == ["t1"]


def test_address_from_ssh_config_alias(sandbox, tmp_path):
    h = sandbox.host("t1")
    from sandbox import base
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host gpu-alias\n  HostName {h.address}\n  User root\n"
                   f"  IdentityFile {base.controller_key()}\n")
    inv = sandbox.inventory({"gpu-alias": {"ssh_config": str(cfg),
                                           "known_hosts": str(sandbox.fleet.site.state / "known_hosts")}})
    res = sandbox.inv("facts", "--host", "gpu-alias", inventory=inv)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["gpu-alias"]["hostname"] == "t1"


@pytest.mark.found("site-per-run")
def test_readme_demo_command(sandbox, tmp_path):
    """`inv sandbox.up deploy --inventory <the sandbox's own> --host sandbox`, twice, in a site of its own.
    `inv sandbox.up` and a test run once swept each other's hosts: they shared a site.  The user's
    sandbox (the default site) and this run's share no name prefix, subnet or state directory, and a
    sandbox brought up and down beside this run leaves its hosts running."""
    from support.site import TEST_SITE
    from sandbox import fleet
    users = fleet.Site()  # `inv sandbox.up` without SPECOPS_SANDBOX_SITE
    assert not users.prefix.startswith(TEST_SITE.prefix) and not TEST_SITE.prefix.startswith(users.prefix)
    assert users.subnet != TEST_SITE.subnet and users.state != TEST_SITE.state
    ours = {h.name: h.pid() for h in sandbox.fleet.hosts}
    assert all(ours.values())
    env = {"SPECOPS_SANDBOX_SITE": f"sod,192.168.233,{tmp_path}/site"}
    inv_dir = tmp_path / "site" / "inventory"
    try:
        first = sandbox.inv("sandbox.up", "deploy", "--inventory", str(inv_dir), "--host", "sandbox", env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "failed=0" in first.stdout and "sglang verified" in first.stdout
        assert "replacing" not in first.stderr  # a site with no host running: nothing to say goes
        demo = fleet.Host("sandbox", 1, fleet.Site("sod", "192.168.233", tmp_path / "site"))
        from sandbox.provision import site_key  # the demo listens beyond loopback, with the site's key
        info = json.loads(demo.run("curl", "-sf", "-H", f"Authorization: Bearer {site_key(demo.site)}",
                                   "http://127.0.0.1:30000/model_info").stdout)
        assert info["model_code"] == "patched: embedding capture"  # the seed's patch is what runs
        before = host_snapshot(demo, "/models/tiny-llama-eagle3/config.json")
        again = sandbox.inv("deploy", "--inventory", str(inv_dir), "--host", "sandbox", env=env)
        assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout
        assert host_snapshot(demo, "/models/tiny-llama-eagle3/config.json") == before
        # The sandbox never wrote into the user's inventory, and a plain deploy with the example reaches nothing.
        assert not (ROOT / "inventory" / "sandbox.yml").exists()
        plain = sandbox.inv("deploy", env={**env, "SPECOPS_INVENTORY": str(ROOT / "inventory.example")})
        assert plain.returncode == 2 and plain.stdout == "" and "choose the hosts" in plain.stderr
    finally:
        down = sandbox.inv("sandbox.down", env=env)
    assert down.returncode == 0 and not (inv_dir / "hosts.yml").exists()
    assert {h.name: h.pid() for h in sandbox.fleet.hosts} == ours  # this run's hosts never went down


def test_the_real_agent_refuses_an_unknown_request_kind_in_one_line(sandbox):
    """Over real SSH to the agent's zip on the host: an unknown kind is refused, naming it."""
    from specops.remote import shipping
    from specops.remote.ssh import Remote
    inv = sandbox.inventory({"t1": {}})
    from specops import inventory as inventory_mod
    (host,) = inventory_mod.load(inv, VOCABULARY).select("t1", None)
    remote = Remote("t1", host.vars)
    try:
        res = remote.exec(shipping.COMMAND, shipping.payload(b'{"kind": "reboot", "now": true}'))
    finally:
        remote.close()
    size, _, body = res.stdout.partition("\n")  # one framed answer: its length, then the JSON
    answer = json.loads(body)
    assert res.rc == 0 and int(size) == len(body.encode()) and answer["ok"] is False
    assert answer["error"].startswith("request: unknown request kind 'reboot' (known: apply, ")
    assert ", check, " in answer["error"] and ", verify" in answer["error"]
    assert "\n" not in answer["error"]
