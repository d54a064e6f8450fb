"""What a local user of a shared GPU box could try against specops, tried for real on sandbox
hosts.  Each test says how it was seen failing with its protection removed."""
import json
import threading
import time

import pytest

from sandbox.provision import sandbox_service
from support.hosts import alice, unit_prop, watching_ps
from support.site import run_inv

pytestmark = pytest.mark.fleet
PASSWD = "/etc/passwd"


def passwd_state(h):
    return h.run("stat", "-c", "%U:%G %a %s", PASSWD).stdout.strip(), h.run("sha256sum", PASSWD).stdout.split()[0]


def alice_owns_a_draft(h):
    h.run("sh", "-c", "id alice >/dev/null 2>&1 || useradd -m alice")
    h.run("sh", "-c", "rm -rf /models/alice-eagle3 && cp -r /models/tiny-llama-eagle3 /models/alice-eagle3 && "
                      "chown -R alice: /models/alice-eagle3")
    # The attack of the report: a staging name specops used to create with exist_ok, as a link.
    alice(h, "mkdir", "/models/alice-eagle3/.specops-stage")
    alice(h, "ln", "-s", PASSWD, "/models/alice-eagle3/.specops-stage/config.json")


def draft_service(**over):
    return sandbox_service(
        speculative={"algorithm": "EAGLE3", "draft_model_path": "/models/alice-eagle3", "num_steps": 3,
                     "eagle_topk": 1, "num_draft_tokens": 4},
        draft_config={"eagle_config.eagle_aux_hidden_state_layer_ids": [2, 16, 30]}, **over)


@pytest.mark.security("staging-symlink", "alice, owner of the draft model directory, plants "
                      "`.specops-stage/config.json -> /etc/passwd`, then swaps config.json itself for a link")
def test_a_user_owned_draft_directory_cannot_redirect_a_write(sandbox):
    """Security 1 (reproduced before the fix: /etc/passwd became alice's 0644).  Seen red: with the
    old staging (exist_ok directory, O_CREAT|O_TRUNC, fchown to the probed owner) the planted link
    was written through."""
    h = sandbox.reset("t1")
    alice_owns_a_draft(h)
    before = passwd_state(h)
    inv = sandbox.inventory({"t1": {"services": [draft_service()]}})

    res, rep = run_inv(sandbox, inv, "deploy", "--host", "t1")
    assert res.returncode == 1, res.stdout
    assert ("/models/alice-eagle3: the directory is writable by alice (mode 0755), who could swap what "
            "specops writes there; list it in allow_shared_dirs") in rep["t1"]["error"]
    assert passwd_state(h) == before

    allowed = sandbox.inventory({"t1": {"services": [draft_service()], "allow_shared_dirs": ["/models/alice-eagle3"]}})
    res, rep = run_inv(sandbox, allowed, "deploy", "--host", "t1")
    assert res.returncode == 0, res.stdout
    assert passwd_state(h) == before
    cfg = h.run("stat", "-c", "%U:%G %a", "/models/alice-eagle3/config.json").stdout.strip()
    assert cfg == "root:root 644"  # never alice's ownership copied onto a file root wrote
    assert json.loads(h.path("/models/alice-eagle3/config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"] == [2, 16, 30]

    # The target itself swapped for a link: refused even where shared directories are allowed.
    alice(h, "mv", "/models/alice-eagle3/config.json", "/models/alice-eagle3/config.orig")
    alice(h, "ln", "-s", PASSWD, "/models/alice-eagle3/config.json")
    changed = sandbox.inventory({"t1": {"services": [draft_service(env={"SGLANG_SIM_STARTUP_DELAY": "0"})],
                                        "allow_shared_dirs": ["/models/alice-eagle3"]}})
    res, rep = run_inv(sandbox, changed, "deploy", "--host", "t1")
    assert res.returncode == 1
    assert "/models/alice-eagle3/config.json is a symbolic link" in rep["t1"]["error"]
    assert passwd_state(h) == before


@pytest.mark.security("user-symlink", "a draft_model_path through alice's symlink to /etc")
def test_a_link_owned_by_a_user_is_never_followed(sandbox):
    """A model path through alice's symlink: specops refuses to read or write behind it."""
    h = sandbox.reset("t2")
    h.run("sh", "-c", "id alice >/dev/null 2>&1 || useradd -m alice")
    alice(h, "ln", "-s", "/etc", "/home/alice/draft")
    svc = sandbox_service(speculative={"algorithm": "EAGLE3", "draft_model_path": "/home/alice/draft",
                                       "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
                          draft_config={"eagle_config.eagle_aux_hidden_state_layer_ids": [2, 16, 29]})
    res, rep = run_inv(sandbox, sandbox.inventory({"t2": {"services": [svc]}}), "deploy", "--host", "t2")
    assert res.returncode == 1, res.stdout
    assert ("/home/alice/draft is a symbolic link owned by alice; specops follows only root's links"
            in rep["t2"]["error"])
    assert not h.run("test", "-e", "/etc/config.json", check=False).returncode == 0


@pytest.mark.security("api-key-argv", "`ps -eww` on the host through the whole deploy; `systemctl status`; the "
                      "journal; /proc/PID/cmdline")
def test_the_api_key_is_never_on_a_command_line_or_in_the_journal(sandbox):
    """Security 2.  Seen red: with the key passed as `--api-key ${KEY}` (the old unit), `ps` showed it."""
    h = sandbox.reset("t3")
    key = "sk-NEVER-in-ps-0123456789"
    svc = sandbox_service(api_key=key, env={"SGLANG_SIM_STARTUP_DELAY": "3"})
    inv = sandbox.inventory({"t3": {"services": [svc]}})
    with watching_ps(h, key, every=0.2) as seen:
        res, _ = run_inv(sandbox, inv, "deploy", "--host", "t3")
    assert res.returncode == 0, res.stdout
    assert seen == []
    assert key not in h.run("systemctl", "status", "sglang", "--no-pager", "-l", check=False).stdout
    journal = h.run("journalctl", "-u", "sglang", "--no-pager", "-o", "cat").stdout
    assert "server_args=" in journal and key not in journal  # the simulator logs its args, as SGLang does
    main = unit_prop(h, "sglang", "MainPID")
    assert key not in h.run("cat", f"/proc/{main}/cmdline").stdout
    assert key not in h.path("/etc/systemd/system/sglang.service").read_text()
    verified = sandbox.inv("verify", "--host", "t3", inventory=inv)
    assert verified.returncode == 0, verified.stdout  # the server got the key: /v1/models needs it


@pytest.mark.security("api-key-quoting", "an API key with `$`, a backtick, a quote and a backslash")
def test_a_key_with_shell_characters_still_verifies(sandbox):
    """Low: a `$` or backtick in the key broke verify (401, then an automatic rollback)."""
    sandbox.reset("t4")
    key = 'k$HOME`id`"\\q'
    svc = sandbox_service(api_key=key, env={"SGLANG_SIM_STARTUP_DELAY": "0"})
    res, rep = run_inv(sandbox, sandbox.inventory({"t4": {"services": [svc]}}), "deploy", "--host", "t4")
    assert res.returncode == 0, res.stdout
    assert "sglang verified" in rep["t4"]["notes"]  # /v1/models and /server_info took the key


@pytest.mark.security("port-squatter", "alice binds 127.0.0.1:30000 while the server loads, answers /health with "
                      "200 and logs the Authorization header")
def test_a_squatter_on_the_port_never_gets_the_key(sandbox):
    """Security 6: while the weights load, a local user binds the port and answers /health with
    200.  Verify checks who listens before any request carries the key."""
    h = sandbox.reset("t5")
    key = "sk-squatted-port-key-42"
    good = sandbox_service(api_key=key, env={"SGLANG_SIM_STARTUP_DELAY": "0"})
    res, _ = run_inv(sandbox, sandbox.inventory({"t5": {"services": [good]}}), "deploy", "--host", "t5")
    assert res.returncode == 0, res.stdout
    h.run("sh", "-c", "id alice >/dev/null 2>&1 || useradd -m alice")
    squatter = ("import http.server\n"
                "class H(http.server.BaseHTTPRequestHandler):\n"
                "    def do_GET(self):\n"
                "        open('/home/alice/captured', 'a').write(str(self.headers.get('Authorization')) + '\\n')\n"
                "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
                "        self.wfile.write(b'{}')\n"
                "    do_POST = do_GET\n"
                "http.server.HTTPServer(('127.0.0.1', 30000), H).serve_forever()\n")
    slow = sandbox_service(api_key=key, env={"SGLANG_SIM_STARTUP_DELAY": "0", "SGLANG_SIM_LOAD_DELAY": "30"})
    inv = sandbox.inventory({"t5": {"services": [slow]}})
    done = {}
    deployer = threading.Thread(target=lambda: done.update(r=run_inv(sandbox, inv, "deploy", "--host", "t5")))
    deployer.start()
    deadline = time.monotonic() + 20  # wait until the old server is gone and the new one loads
    while time.monotonic() < deadline and h.run("ss", "-ltn", "sport = :30000", check=False).stdout.count("LISTEN"):
        time.sleep(0.2)
    h.run("systemd-run", "--unit", "squatter", "--uid", "alice", "python3", "-c", squatter)
    deployer.join(120)
    res, rep = done["r"]
    assert res.returncode == 1
    assert "127.0.0.1:30000: port 30000 is served by pid" in res.stdout and "(user alice: " in res.stdout, res.stdout
    captured = h.run("cat", "/home/alice/captured", check=False).stdout
    assert key not in captured
    h.run("systemctl", "stop", "squatter", check=False)


def known_hosts_for(tmp_path, text=""):
    path = tmp_path / "known_hosts"
    path.write_text(text)
    return path


def listen_on(h, port):
    h.run("sh", "-c", f"printf 'Port 22\\nPort {port}\\n' > /etc/ssh/sshd_config.d/ports.conf && systemctl restart ssh")
    deadline = time.monotonic() + 10
    while f":{port}" not in h.run("ss", "-ltn", check=False).stdout and time.monotonic() < deadline:
        time.sleep(0.1)


def new_host_key(h):
    h.run("sh", "-c", "rm -f /etc/ssh/ssh_host_ed25519_key* && ssh-keygen -q -t ed25519 -N '' "
                      "-f /etc/ssh/ssh_host_ed25519_key && systemctl restart ssh")


@pytest.mark.security("host-key-port", "sshd on port 2222 changes its host key after accept-new")
def test_accept_new_pins_the_key_on_another_port(sandbox, tmp_path):
    """Security 3 (reproduced before the fix: the entry was written as [[host]:2222]:2222, never
    matched, and a changed key was accepted as new)."""
    h = sandbox.reset("t1")
    listen_on(h, 2222)
    known = known_hosts_for(tmp_path)
    inv = sandbox.inventory({"t1": {"ssh_port": 2222, "known_hosts": str(known)}})
    first = sandbox.inv("facts", "--host", "t1", "--accept-new-host-key", inventory=inv)
    assert first.returncode == 0, first.stderr
    assert known.read_text() == f"[{h.address}]:2222 ssh-ed25519 {h.host_key_pub}\n"
    assert sandbox.inv("facts", "--host", "t1", inventory=inv).returncode == 0  # the pinned key matches
    new_host_key(h)
    changed = sandbox.inv("facts", "--host", "t1", "--accept-new-host-key", inventory=inv)
    assert changed.returncode != 0 and "host key CHANGED" in changed.stdout + changed.stderr
    assert known.read_text().count("\n") == 1  # nothing recorded for the changed key


@pytest.mark.security("proxyjump-hop", "an unknown, then a wrong, host key on the ProxyJump bastion")
def test_every_proxyjump_hop_checks_its_host_key(sandbox, tmp_path):
    """Security 4 (reproduced before the fix: the bastion hop kept Fabric's AutoAddPolicy).  The
    bastion is t2; the target is t2's own sshd reached through it, on its loopback."""
    from sandbox import base, fleet
    h = sandbox.reset("t2")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host bastion\n  HostName {h.address}\n  User root\n  IdentityFile {base.controller_key()}\n"
                   f"Host behind\n  HostName 127.0.0.1\n  User root\n  ProxyJump bastion\n"
                   f"  IdentityFile {base.controller_key()}\n")
    # The target's key is known; the bastion's is not.
    known = known_hosts_for(tmp_path, f"127.0.0.1 ssh-ed25519 {h.host_key_pub}\n")
    inv = sandbox.inventory({"behind": {"ssh_config": str(cfg), "known_hosts": str(known)}})
    refused = sandbox.inv("facts", "--host", "behind", inventory=inv)
    assert refused.returncode != 0
    assert "unknown host key ssh-ed25519" in refused.stderr and f"for {h.address}" in refused.stderr, refused.stderr
    # A wrong key for the bastion: always refused, even with accept-new.
    known.write_text(f"127.0.0.1 ssh-ed25519 {h.host_key_pub}\n{h.address} ssh-ed25519 "
                     f"{sandbox.host('t1').host_key_pub}\n")
    changed = sandbox.inv("facts", "--host", "behind", "--accept-new-host-key", inventory=inv)
    assert changed.returncode != 0 and "host key CHANGED" in changed.stderr, changed.stderr
    # Both keys right: through the bastion it works.
    known.write_text(f"127.0.0.1 ssh-ed25519 {h.host_key_pub}\n{h.address} ssh-ed25519 {h.host_key_pub}\n")
    ok = sandbox.inv("facts", "--host", "behind", inventory=inv)
    assert ok.returncode == 0 and json.loads(ok.stdout)["behind"]["hostname"] == "t2", ok.stderr


@pytest.mark.security("leftover-killer", "a process of another user, and a root process outside the unit, "
                                         "with `sglang --port 30000` in their command lines, holding GPU memory")
def test_stop_kills_nothing_it_cannot_attribute(sandbox):
    """Security 5 (before: `"--port %d" in cmd` also matched --port 3000 and other users)."""
    h = sandbox.reset("t3")
    inv = sandbox.inventory({"t3": {"services": [sandbox_service(port=3000, env={"SGLANG_SIM_STARTUP_DELAY": "0"})]}})
    res, _ = run_inv(sandbox, inv, "deploy", "--host", "t3")
    assert res.returncode == 0, res.stdout
    h.run("sh", "-c", "id alice >/dev/null 2>&1 || useradd -m alice; chmod 1777 /run/sglang-sim/gpu")
    job = ("import json, os, sys, time\n"
           "open('/run/sglang-sim/gpu/%d.json' % os.getpid(), 'w').write(json.dumps("
           "{'pid': os.getpid(), 'gpus': [0], 'label': 'x', 'used_memory': 500}))\n"
           "time.sleep(600)\n")
    h.run("systemd-run", "--unit", "alices-sglang", "--uid", "alice", "python3", "-c", job, "sglang", "--port", "30000")
    h.run("systemd-run", "--unit", "roots-sglang", "python3", "-c", job, "sglang", "--port", "30000")
    time.sleep(1)
    others = {u: h.run("systemctl", "show", "-p", "MainPID", "--value", u).stdout.strip()
              for u in ("alices-sglang", "roots-sglang")}
    res, rep = run_inv(sandbox, inv, "stop", "--host", "t3")
    assert res.returncode == 1  # memory is still held, by processes that are not sglang's
    for unit, pid in others.items():
        assert f"pid {pid} (" in rep["t3"]["error"]
        assert h.run("test", "-d", f"/proc/{pid}", check=False).returncode == 0, f"{unit} was killed"
    assert "killed leftover" not in res.stdout
    h.run("systemctl", "stop", "alices-sglang", "roots-sglang")
