"""Weights from a Hugging Face hub: the sandbox hub is olah (a real self-hosted mirror, offline,
serving local git repositories) behind a gate that adds Range, gated repos and cuts; the host
fetches with the real huggingface_hub client through HF_ENDPOINT."""
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandbox import hub as hub_mod, provision
from sandbox.provision import sandbox_service
from specops.layout import HF_PIN
from support.hosts import alice, watching_ps
from support.weights import DRAFT, INDEX, TARGET, host_sha256, hub_service, hub_sha256, run

pytestmark = pytest.mark.fleet
TOTAL = sum(len(d) for d in hub_mod.REPOS["sandbox/tiny-llama"].values()) + \
    sum(len(d) for d in hub_mod.REPOS["sandbox/tiny-llama-eagle3"].values())


@pytest.mark.security("bare-box", "a rented box with no /models: the directories above the weights made root's 0755, "
                      "not left to whoever makes them first")
def test_bare_ubuntu_box_bootstraps_with_weights_from_the_hub_then_moves_nothing(sandbox, hub, pkg_index):
    """Issue 23, item 5 (reproduced before the fix: '/models: No such file or directory').  Seen
    red with make_dir's parents removed."""
    h = sandbox.reset("t1", layers=[provision.layer("bare")], flavour="ubuntu-sudo")
    assert not h.path("/models").exists() and not h.path(provision.VENV).exists()
    index = {"torch": {"version": "2.9.1", "cuda": "auto", "index_url": f"{pkg_index.url}/whl/{{variant}}"},
             "sglang": {"version": "0.5.23"}, "package_index": f"{pkg_index.url}/simple"}
    served = hub.served()
    res, rep = run(sandbox, "t1", hub_service(hub), "bootstrap", host_vars=index, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "sglang verified" in rep["notes"]
    assert h.run("stat", "-c", "%U:%G %a", "/models").stdout.strip() == "root:root 755"
    assert hub.served() - served == TOTAL  # every byte once
    assert host_sha256(h, TARGET, hub_mod.REPOS["sandbox/tiny-llama"]) == hub_sha256("sandbox/tiny-llama")
    assert host_sha256(h, DRAFT, hub_mod.REPOS["sandbox/tiny-llama-eagle3"]) == hub_sha256("sandbox/tiny-llama-eagle3")
    assert "weights sandbox/tiny-llama:" in res.stdout and "MiB/s, ETA" in res.stdout  # progress on the controller
    manifests = h.run("sh", "-c", "cat /var/lib/specops/weights/*.json").stdout
    assert hub.shas["sandbox/tiny-llama"] in manifests  # the commit `main` resolved to
    stamps = h.run("sh", "-c", f"stat -c '%n %s %Y %i' {TARGET}/* {DRAFT}/*").stdout

    served = hub.served()
    res, rep = run(sandbox, "t1", hub_service(hub), "bootstrap", host_vars=index)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]
    assert hub.served() == served  # 0 bytes moved
    assert h.run("sh", "-c", f"stat -c '%n %s %Y %i' {TARGET}/* {DRAFT}/*").stdout == stamps


def test_a_cut_download_resumes_and_ends_with_every_sha256(sandbox, hub):
    h = sandbox.reset("t2")
    hub.cut()
    served = hub.served()
    res, rep = run(sandbox, "t2", hub_service(hub))
    hub.uncut()
    assert res.returncode == 1, res.stdout[-2000:]
    assert "hub sandbox/tiny-llama@main:" in rep["error"], rep["error"]
    cut_at = hub.served() - served
    assert 0 < cut_at < TOTAL
    served = hub.served()
    res, rep = run(sandbox, "t2", hub_service(hub))
    assert res.returncode == 0, res.stdout[-3000:]
    # The re-run moved what the cut run had not, and less than one transfer chunk (1 MiB) again:
    # the cut file continued where it stopped (seen red with the gate's Range support removed:
    # the file came again from its start, 2 MiB more).
    again = hub.served() - served - (TOTAL - cut_at)
    assert 0 <= again < 1 << 20, again
    assert host_sha256(h, TARGET, hub_mod.REPOS["sandbox/tiny-llama"]) == hub_sha256("sandbox/tiny-llama")


def test_one_changed_byte_is_found_by_its_ctime_and_only_that_file_moves(sandbox, hub):
    h = sandbox.reset("t3")
    res, _ = run(sandbox, "t3", hub_service(hub))
    assert res.returncode == 0, res.stdout[-3000:]
    shard = "model-00002-of-00002.safetensors"
    path = h.path(f"{TARGET}/{shard}")
    st = os.stat(path)
    with open(path, "r+b") as f:  # one byte, size and mtime kept
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    served = hub.served()
    res, rep = run(sandbox, "t3", hub_service(hub))
    # Size and mtime kept, but written after its manifest (its ctime): the probe hashes that file,
    # and the deploy fetches it again (that file only) and restarts the server onto the hub's bytes.
    assert res.returncode == 0 and rep["changed"] == 2, res.stdout[-3000:]
    assert f"{shard} differs: fetched again" in res.stdout, res.stdout[-3000:]
    assert f"weights changed since the server started ({TARGET}); restart" in res.stdout
    assert hub.served() - served == len(hub_mod.REPOS["sandbox/tiny-llama"][shard])  # that file only
    assert host_sha256(h, TARGET, [shard])[shard] == hub_sha256("sandbox/tiny-llama")[shard]
    res, rep = run(sandbox, "t3", hub_service(hub), "deploy", "--verify-weights")  # every file hashed: all right
    assert res.returncode == 0 and "3 file(s), 0.0 MiB moved" in res.stdout, res.stdout[-3000:]
    assert "restart" not in res.stdout and hub.served() - served == len(hub_mod.REPOS["sandbox/tiny-llama"][shard])


def test_a_gated_repo_needs_the_token_which_appears_nowhere(sandbox, hub):
    h = sandbox.reset("t5")
    res, rep = run(sandbox, "t5", hub_service(hub, repo="sandbox/gated-llama"))
    assert res.returncode == 1
    assert "sandbox/gated-llama is gated: set the service's env_secret HF_TOKEN" in rep["error"], rep["error"]
    svc = hub_service(hub, repo="sandbox/gated-llama", env_secret={"HF_TOKEN": hub_mod.TOKEN})
    seen = []
    with ThreadPoolExecutor(1) as pool:  # the host's process list, while the fetch runs
        done = pool.submit(run, sandbox, "t5", svc)
        while not done.done():
            seen.append(h.run("ps", "-eww", "-o", "args", check=False).stdout)
            time.sleep(0.2)
        res, rep = done.result()
    assert res.returncode == 0, res.stdout[-3000:]
    assert any("huggingface" in s or "hf-" in s for s in seen)  # the client was seen running
    # Only the service's 0600 env file holds it (as every env_secret): not the output, the report
    # (both redacted anyway), the journal, specops's own files, the unit or any argv.
    texts = [res.stdout, res.stderr, json.dumps(rep), *seen,
             h.run("sh", "-c", "journalctl --no-pager -o cat; cat /var/lib/specops/weights/*.json "
                               "/var/lib/specops/releases/*/manifest.json /var/lib/specops/*.json "
                               "/etc/systemd/system/sglang.service").stdout]
    assert not [t for t in texts if hub_mod.TOKEN in t]
    assert hub_mod.TOKEN in h.run("cat", "/etc/specops/sglang.env").stdout
    assert h.run("stat", "-c", "%a", "/etc/specops/sglang.env").stdout.strip() == "600"


def test_weights_pushed_from_the_controller_resume_and_then_move_nothing(sandbox, tmp_path):
    """The controller's copy is pushed; a cut push (its NAME.part left on the host, as a lost
    connection leaves it) resumes where it stopped; a re-run pushes nothing."""
    h = sandbox.reset("t4")
    local = tmp_path / "ctl-llama"
    local.mkdir()
    files = {n: d for n, d in hub_mod.REPOS["sandbox/tiny-llama"].items()}
    for n, d in files.items():
        (local / n).write_bytes(d)
    big = "model-00001-of-00002.safetensors"
    h.run("mkdir", "-p", "/models/ctl-llama")
    h.path(f"/models/ctl-llama/{big}.part").write_bytes(files[big][:len(files[big]) // 2])
    h.path("/models/ctl-llama/config.json").write_bytes(files["config.json"])  # one the cut push had finished
    svc = sandbox_service(model_path="/models/ctl-llama", weights={"source": "controller", "path": str(local)})
    res, rep = run(sandbox, "t4", svc)
    assert res.returncode == 0, res.stdout[-3000:]
    total = sum(len(d) for d in files.values())
    # The cut file from where it stopped; the finished one not again (checked by its sha256 instead).
    assert rep["bytes_pushed"] == total - len(files[big]) // 2 - len(files["config.json"])
    assert "1 already there, to be checked" in res.stdout
    assert "resuming after 2.0 MiB" in res.stdout and "MiB/s, ETA" in res.stdout
    assert host_sha256(h, "/models/ctl-llama", files) == {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
    res, rep = run(sandbox, "t4", svc)
    assert res.returncode == 0 and rep["changed"] == 0 and rep["bytes_pushed"] == 0, res.stdout[-3000:]

    # A same-size file with other bytes, left where a finished one would be: found, removed, and
    # the next run sends it.
    shard = "model-00002-of-00002.safetensors"
    h.run("rm", "-f", f"/var/lib/specops/weights/{os.path.basename(manifest_of(h, '/models/ctl-llama'))}")
    h.path(f"/models/ctl-llama/{shard}").write_bytes(bytes(len(files[shard])))
    res, rep = run(sandbox, "t4", svc)
    assert res.returncode == 1 and f"/models/ctl-llama/{shard} differs from the controller's copy" in rep["error"]
    res, rep = run(sandbox, "t4", svc)
    assert res.returncode == 0 and rep["bytes_pushed"] == len(files[shard]), res.stdout[-3000:]
    assert host_sha256(h, "/models/ctl-llama", files) == {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}


def manifest_of(h, dest):
    return h.run("sh", "-c", f"grep -l '\"dest\": \"{dest}\"' /var/lib/specops/weights/*.json").stdout.strip()


@pytest.mark.security("weights-dir-swap", "alice renames a root-owned weights directory in her home, mid-fetch, and "
                      "puts a link to /root/.ssh in its place (the mirror serves a file named authorized_keys); then a "
                      "directory of her own with same-size, same-mtime files")
def test_a_weights_directory_swapped_mid_fetch_never_redirects_roots_writes(sandbox, hub):
    """Issue 23, item 1 (reproduced before the fix: root's authorized_keys became the mirror's).
    The directory is root's 0755, as `sudo mkdir` in a user's home makes it; its parent is alice's.
    Refused as it is; with the parent in allow_shared_dirs, the hub holds the listing (the host has
    made its checks), alice swaps, the hub goes on.  Seen red with the old weights.py and hub.py:
    'authorized_keys differs: fetched again', and root's keys replaced."""
    h = sandbox.reset("t5")
    h.run("sh", "-c", "id alice >/dev/null 2>&1 || useradd -m alice")
    alice(h, "mkdir", "/home/alice/w")
    h.run("mkdir", "/home/alice/w/planted")  # root's, in alice's directory
    keys = h.run("sha256sum", "/root/.ssh/authorized_keys").stdout.split()[0]
    listing = h.run("ls", "-A", "/root/.ssh").stdout
    svc = hub_service(hub, repo="sandbox/planted", model_path="/home/alice/w/planted")
    served = hub.served()
    res, rep = run(sandbox, "t5", svc)
    assert res.returncode == 1 and "/home/alice/w/planted: /home/alice is owned by alice" \
        in rep["error"], res.stdout[-2000:]
    assert hub.served() == served  # refused before any byte moved

    shared = {**INDEX, "allow_shared_dirs": ["/home/alice"]}
    hub.hold("sandbox/planted")
    try:
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(run, sandbox, "t5", svc, host_vars=shared)
            hub.wait_held()
            alice(h, "mv", "/home/alice/w/planted", "/home/alice/w/moved")
            alice(h, "ln", "-s", "/root/.ssh", "/home/alice/w/planted")
            hub.release()
            res, rep = done.result()
    finally:
        hub.release()
    assert h.run("sha256sum", "/root/.ssh/authorized_keys").stdout.split()[0] == keys, res.stdout[-2000:]
    assert h.run("ls", "-A", "/root/.ssh").stdout == listing, res.stdout[-2000:]
    # The fetch went on into the directory it had checked and opened, wherever alice moved it.
    assert h.path("/home/alice/w/moved/authorized_keys").read_bytes() == hub_mod.PLANTED_KEY, res.stdout[-2000:]
    assert h.run("stat", "-c", "%U %a", "/home/alice/w/moved/authorized_keys").stdout.split() == ["root", "644"]
    assert res.returncode == 1 and "/home/alice/w/planted" in rep["error"], res.stdout[-2000:]

    # A directory of alice's with the manifest's sizes and mtimes is not taken for the fetched one.
    alice(h, "rm", "/home/alice/w/planted")
    alice(h, "cp", "-rp", "/home/alice/w/moved", "/home/alice/w/planted")
    res, rep = run(sandbox, "t5", svc, host_vars=shared)
    assert res.returncode == 1 and "/home/alice/w/planted is owned by uid" in rep["error"], res.stdout[-2000:]
    assert "weights sandbox/planted@main in /home/alice/w/planted: ok" not in res.stdout


@pytest.mark.security("weights-dir-race", "a weights directory made by a local user, with a `.part` of hers inside, "
                      "between the agent's check and its mkdir (widened to 3 s by a test hook)")
def test_a_weights_directory_she_makes_in_the_race_window_is_refused_and_her_part_never_served(sandbox, hub):
    """Issue 34, medium 2, on the fleet.  Her home is in allow_shared_dirs; the weights directory
    does not exist.  The agent finds it missing, then waits 3 s before its mkdir (the hook, set in
    the host's /etc/environment, which sshd's PAM gives the agent); she makes it then, with an
    empty shard `.part` of hers.  Seen red with the fix removed (make_dir chowning what it found,
    the `.part` written as it was): the served shard was alice's 644."""
    h = sandbox.reset("t4")
    h.run("sh", "-c", "id alice >/dev/null 2>&1 || useradd -m alice")
    dest, shard = "/home/alice/m", "model-00001-of-00002.safetensors"
    h.run("sh", "-c", f"echo SPECOPS_TEST_SLOW_MKDIR={dest}:3 >> /etc/environment")
    shared = {**INDEX, "allow_shared_dirs": ["/home/alice"]}
    svc = hub_service(hub, model_path=dest)
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(run, sandbox, "t4", svc, host_vars=shared)
        deadline = time.monotonic() + 120  # bounds a broken test; no outcome depends on it
        while h.run("test", "-e", "/run/specops-test-slow-mkdir", check=False).returncode:  # found it missing
            assert not done.done() and time.monotonic() < deadline, done.result()[0].stdout[-2000:]
            time.sleep(0.05)
        alice(h, "mkdir", dest)
        alice(h, "touch", f"{dest}/{shard}.part")
        res, rep = done.result()
    assert res.returncode == 1 and f"{dest}: a directory of alice's, not made by specops; refused" in rep["error"], \
        res.stdout[-2000:]
    assert h.run("stat", "-c", "%U %s", f"{dest}/{shard}.part").stdout.split() == ["alice", "0"]  # not written
    assert h.run("ls", "-A", dest).stdout.split() == [f"{shard}.part"]  # nothing served from her directory
    assert h.run("stat", "-c", "%U", dest).stdout.strip() == "alice"  # not taken over


@pytest.mark.security("index-password-argv", "`ps -eww` on the host every 0.1 s while a bare host's hub tool is "
                      "installed from a package index whose URL holds a password")
def test_an_index_password_never_reaches_a_command_line(sandbox, hub):
    """Issue 34, medium 1, on the fleet: pip installs the hub client from the index in
    `package_index`, user and password in its URL.  Seen red with pip given `--index-url URL` (the
    old hub.tool_python): the watcher read the password in pip's command line."""
    h = sandbox.reset("t3")
    password = "s3cret-NEVER-in-ps"
    index = INDEX["package_index"].replace("http://", f"http://specops:{password}@")
    with watching_ps(h, password) as seen:
        res, _ = run(sandbox, "t3", hub_service(hub), host_vars={**INDEX, "package_index": index})
    assert res.returncode == 0, res.stdout[-2000:]
    assert h.run("test", "-x", f"/var/lib/specops/tools/hf-{HF_PIN}/bin/python", check=False).returncode == 0  # pip ran
    assert seen == [] and password not in res.stdout


@pytest.mark.security("transfer-after-ctrl-c", "Ctrl-C during a slow hub download (a transfer that writes nothing to "
                      "its agent while it runs), then a look at the host the moment the controller exits")
def test_ctrl_c_ends_the_download_before_the_lock_is_given_back(sandbox, hub):
    """Issue 23, item 4 (reproduced before the fix: the download, re-parented to PID 1, wrote on for
    18 s after the lock was given back).  Seen red with the agent's channel watcher removed: the
    hub client was still running, and its .part files growing, after the controller had exited.
    Logged in through sudo: there the agent's parent is sudo's shell, which the end of the SSH
    connection does not end, so no parent-death signal reaches the agent either."""
    h = sandbox.reset("t4", flavour="ubuntu-sudo")
    inv = sandbox.inventory({"t4": {"services": [hub_service(hub)], **INDEX}})
    client, seen = f"tools/hf-{HF_PIN}/bin/python", []
    hub.slow(64 << 10)  # a shard takes a minute: far longer than the lock waits for a command
    try:
        status, out = sandbox.interrupt("deploy", "--host", "t4", inventory=inv, when="MiB/s, ETA",
                                        before=lambda: seen.extend(h.run("pgrep", "-f", client).stdout.split()))
    finally:
        hub.slow(None)
    assert status == 130 and "interrupted" in out, out[-3000:]
    assert seen, out[-3000:]  # the client was running when Ctrl-C came ...
    assert h.run("pgrep", "-f", client, check=False).stdout.split() == [], out[-3000:]  # ... and is gone
    assert h.run("test", "-d", "/run/specops.lock", check=False).returncode != 0  # and the lock is back
    parts = f"stat -c '%n %s' {TARGET}/*.part"
    cut = h.run("sh", "-c", parts, check=False).stdout
    assert ".part" in cut, out[-3000:]  # it was cut mid-file ...
    time.sleep(2)
    assert h.run("sh", "-c", parts, check=False).stdout == cut  # ... and nothing writes there any more
    res, rep = run(sandbox, "t4", hub_service(hub))  # the next run resumes, and ends with every sha256
    assert res.returncode == 0, res.stdout[-3000:]
    assert host_sha256(h, TARGET, hub_mod.REPOS["sandbox/tiny-llama"]) == hub_sha256("sandbox/tiny-llama")
