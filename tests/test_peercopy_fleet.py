"""Weights copied from a peer box: host to host over a link the controller is not on, with a key
made for that one copy and gone afterwards, also when the copy is killed midway.

t2 is the peer (logged into as `ubuntu`, like a cloud image), t1 the destination; a veth pair
joins their namespaces (sandbox/peerlink.py).  The controller's side of each host's own link
counts what passes through it; the peer link counts what went host to host."""
import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from sandbox import hub as hub_mod, peerlink
from sandbox.provision import sandbox_service
from support import ROOT
from support.files import load_json

pytestmark = pytest.mark.fleet
PEER_PATH, DEST = "/models/peer-llama", "/models/copied-llama"
BIG = "consolidated-00001.safetensors"
FILES = {**hub_mod.REPOS["sandbox/tiny-llama"], BIG: os.urandom(24 << 20)}
TOTAL = sum(len(d) for d in FILES.values())
KEYS = "/home/ubuntu/.ssh/authorized_keys"


@pytest.fixture(scope="module")
def pair(fleet):
    """(destination, peer, the peer's address on the link), the peer holding the weights."""
    dest, peer = fleet.reset("t1"), fleet.reset("t2", flavour="ubuntu-sudo")
    from sandbox import provision
    provision.write_known_hosts(fleet)
    _, peer_address = peerlink.up(dest, peer)
    peer.run("mkdir", "-p", PEER_PATH)
    for name, data in FILES.items():
        peer.path(f"{PEER_PATH}/{name}").write_bytes(data)
    yield dest, peer, peer_address
    peerlink.down(dest, peer)
    fleet.reset("t2")  # later tests log into it as root
    provision.write_known_hosts(fleet)


def service(peer_address, **source):
    return sandbox_service(model_path=DEST, weights={"source": "peer", "host": "t2", "path": PEER_PATH,
                                                     "address": peer_address, **source})


def inventory(sandbox, peer_address, **source):
    from sandbox import logins, provision
    t2 = {**provision.host_vars(sandbox.fleet["t2"]), **logins.host_vars("ubuntu-sudo")}
    return sandbox.inventory({"t1": {"services": [service(peer_address, **source)]}, "t2": t2})


def deploy(sandbox, inv, *args, **kw):
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    res = sandbox.inv("deploy", "--host", "t1", "--json", str(report), *args, inventory=inv, **kw)
    return res, (load_json(report)["hosts"]["t1"] if report.exists() else None)


def sha256s(h, path):
    out = h.run("sh", "-c", f"cd {path} && sha256sum *").stdout
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def left_behind(dest, peer):
    """A copy key anywhere: in the peer's authorized_keys, or in the destination's key directory."""
    return [line for line in peer.run("cat", KEYS).stdout.splitlines() if "specops-peer" in line] + \
        dest.run("sh", "-c", "ls -A /var/lib/specops/peer 2>/dev/null || true").stdout.split()


def test_weights_are_copied_host_to_host_then_not_again(sandbox, pair, tmp_path):
    dest, peer, address = pair
    inv = inventory(sandbox, address)
    keys_before = peer.run("cat", KEYS).stdout
    peerlink.shape(peer, dest, 100)  # a few seconds: the progress shows
    res, rep = deploy(sandbox, inv, "--check")
    assert res.returncode == 0 and "copy from the peer, host to host" in res.stdout, res.stdout[-2000:]
    assert not dest.path(DEST).exists() and not left_behind(dest, peer)

    via_controller, over_link = peerlink.controller_bytes(dest, peer), peerlink.link_bytes(dest, peer)
    res, rep = deploy(sandbox, inv)
    assert res.returncode == 0 and "sglang verified" in rep["notes"], res.stdout[-3000:]
    via_controller = peerlink.controller_bytes(dest, peer) - via_controller
    over_link = peerlink.link_bytes(dest, peer) - over_link
    print(f"\ncopy of {TOTAL} bytes: {over_link} over the peer link, {via_controller} through the controller, "
          f"rsync received {rep['bytes_copied']}")
    assert over_link >= TOTAL and rep["bytes_copied"] >= TOTAL, (over_link, rep["bytes_copied"])
    assert via_controller < TOTAL / 8, via_controller  # requests, answers, progress: not the weights
    assert "weights t2:/models/peer-llama" in res.stdout and "MiB/s, ETA" in res.stdout
    assert sha256s(dest, DEST) == {n: hashlib.sha256(d).hexdigest() for n, d in FILES.items()}
    assert peer.run("cat", KEYS).stdout == keys_before and not left_behind(dest, peer)
    modes = dest.run("sh", "-c", f"stat -c '%U %a %n' {DEST} {DEST}/*").stdout.split("\n")
    assert all(m.startswith("root 755 ") or m.startswith("root 644 ") for m in modes if m), modes

    over_link, to_peer = peerlink.link_bytes(dest, peer), peerlink.controller_bytes(peer)
    res, rep = deploy(sandbox, inv)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]
    assert peerlink.link_bytes(dest, peer) - over_link < 4096  # nothing copied ...
    assert peerlink.controller_bytes(peer) - to_peer < 4096    # ... and the peer not even asked

    # One byte changed behind the manifest's back (size and mtime kept): its ctime says it was written
    # after the manifest, the probe hashes it, and the deploy copies it again, comparing by checksum
    # (rsync's quick check would skip it), that file only, then restarts the server onto it.
    shard = "model-00002-of-00002.safetensors"
    st = os.stat(dest.path(f"{DEST}/{shard}"))
    with open(dest.path(f"{DEST}/{shard}"), "r+b") as f:
        f.write(b"\xff")
    os.utime(dest.path(f"{DEST}/{shard}"), ns=(st.st_atime_ns, st.st_mtime_ns))
    peerlink.shape(peer, dest, None)
    res, rep = deploy(sandbox, inv)
    assert res.returncode == 0 and rep["changed"] == 2, res.stdout[-3000:]
    assert f"{len(FILES)} file(s), 1 copied" in res.stdout, res.stdout[-3000:]
    assert f"weights changed since the server started ({DEST}); restart" in res.stdout
    print(f"a plain deploy with one byte changed: rsync received {rep['bytes_copied']}")
    assert rep["bytes_copied"] < TOTAL / 4
    assert sha256s(dest, DEST)[shard] == hashlib.sha256(FILES[shard]).hexdigest()
    res, rep = deploy(sandbox, inv, "--verify-weights")  # every file compared by checksum: all right
    assert res.returncode == 0 and f"{len(FILES)} file(s), 0 copied" in res.stdout, res.stdout[-3000:]
    assert "restart" not in res.stdout

    # The control: the same weights pushed from the controller do show on its counters.
    local = tmp_path / "weights"
    local.mkdir()
    for name, data in FILES.items():
        (local / name).write_bytes(data)
    pushed = sandbox.inventory({"t1": {"services": [sandbox_service(
        model_path="/models/pushed-llama", weights={"source": "controller", "path": str(local)})]}})
    via_controller = peerlink.controller_bytes(dest, peer)
    res, _ = deploy(sandbox, pushed)
    assert res.returncode == 0, res.stdout[-2000:]
    print(f"control, pushed from the controller: {peerlink.controller_bytes(dest, peer) - via_controller} bytes "
          f"through the controller")
    assert peerlink.controller_bytes(dest, peer) - via_controller >= TOTAL


def test_a_killed_copy_leaves_no_key_and_the_next_run_resumes(sandbox, pair):
    dest, peer, address = pair
    inv = inventory(sandbox, address)
    keys_before = peer.run("cat", KEYS).stdout
    dest.run("rm", "-rf", DEST, "/var/lib/specops/weights")
    peerlink.shape(peer, dest, 40)  # ~6 s for the whole copy

    # rsync killed on the destination midway (as an OOM kill or an admin would): the run fails
    # in one line, the key is gone from both boxes, the cut file stays for the next run.
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "deploy", "--host", "t1"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "SPECOPS_INVENTORY": str(inv)})
    assert _copied_some(dest), "the copy never started"
    granted = [line for line in peer.run("cat", KEYS).stdout.splitlines() if "specops-peer" in line]
    seen = time.time()
    dest.run("pkill", "-TERM", "-x", "rsync")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1 and "copy from t2:/models/peer-llama failed (rsync exit" in out, out[-2000:]
    _expires_ten_minutes_after(peer, granted, started, seen)
    assert peer.run("cat", KEYS).stdout == keys_before and not left_behind(dest, peer)

    peerlink.shape(peer, dest, None)
    over_link = peerlink.link_bytes(dest, peer)
    res, rep = deploy(sandbox, inv)
    assert res.returncode == 0, res.stdout[-3000:]
    print(f"resumed copy: {peerlink.link_bytes(dest, peer) - over_link} of {TOTAL} bytes over the link")
    assert peerlink.link_bytes(dest, peer) - over_link < TOTAL * 0.9  # resumed, not sent again
    assert sha256s(dest, DEST) == {n: hashlib.sha256(d).hexdigest() for n, d in FILES.items()}

    # The controller itself killed midway (SIGKILL: no finally runs): the destination's agent
    # dies with its session and takes the key and rsync with it; the grant left on the peer is
    # removed by the next copy to this host (its lock is then ours: no copy of that run is alive).
    dest.run("rm", "-rf", DEST, "/var/lib/specops/weights")
    peerlink.shape(peer, dest, 40)
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "deploy", "--host", "t1"], cwd=ROOT, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "SPECOPS_INVENTORY": str(inv), "SPECOPS_LOCK_LEASE": "3"})
    assert _copied_some(dest), "the copy never started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [line for line in peer.run("cat", KEYS).stdout.splitlines() if "specops-peer" in line]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (dest.run("pgrep", "-x", "rsync", check=False).returncode == 0
                                           or dest.run("ls", "-A", "/var/lib/specops/peer").stdout.strip()):
        time.sleep(0.5)
    assert dest.run("pgrep", "-x", "rsync", check=False).returncode == 1
    assert not dest.run("ls", "-A", "/var/lib/specops/peer").stdout.strip()
    peerlink.shape(peer, dest, None)
    time.sleep(3)  # the killed run's lease
    res, rep = deploy(sandbox, inv)
    assert res.returncode == 0, res.stdout[-3000:]
    assert peer.run("cat", KEYS).stdout == keys_before and not left_behind(dest, peer)


@pytest.mark.security("peer-host-key", "another sshd answers at the peer's address on the link, with its own host "
                        "key, for a copy of weights from that peer")
def test_a_peer_presenting_another_host_key_is_refused(sandbox, pair):
    """Something else answers at the peer's address on the link, with a host key of its own (here
    a second sshd on the peer, port 2222: the same users and authorized_keys, another host key).
    The destination's ssh accepts only the key the controller's own connection accepted: the copy
    is refused in one line and nothing comes over (with StrictHostKeyChecking=no it goes through)."""
    dest, peer, address = pair
    keys_before = peer.run("cat", KEYS).stdout
    dest.run("rm", "-rf", DEST, "/var/lib/specops/weights")
    peer.run("rm", "-f", "/etc/ssh/impostor_key", "/etc/ssh/impostor_key.pub")
    peer.run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "impostor", "-f", "/etc/ssh/impostor_key")
    peer.run("/usr/sbin/sshd", "-h", "/etc/ssh/impostor_key", "-o", f"ListenAddress={address}:2222",
             "-o", "PidFile=/run/sshd-impostor.pid")
    try:
        over_link = peerlink.link_bytes(dest, peer)
        res, rep = deploy(sandbox, inventory(sandbox, address, port=2222))
        over_link = peerlink.link_bytes(dest, peer) - over_link
    finally:
        peer.run("sh", "-c", "kill $(cat /run/sshd-impostor.pid)", check=False)
    said = f"copy from t2:{PEER_PATH} failed (rsync exit 255): the peer's host key at {address} is not the one " \
        "the controller accepted"
    assert res.returncode == 1 and said in rep["error"] and "\n" not in rep["error"], res.stdout[-3000:]
    assert f"FAILED: {rep['error']}" in res.stdout and "Traceback" not in res.stdout + res.stderr
    found = dest.run("sh", "-c", f"find {DEST} -type f 2>/dev/null || true").stdout.split()
    assert not found and over_link < 64 << 10, (found, over_link)  # an SSH handshake, no weights
    assert peer.run("cat", KEYS).stdout == keys_before and not left_behind(dest, peer)


def _expires_ten_minutes_after(peer, granted, since, seen):
    """The one grant's expiry by the wall clock: ten minutes after it was made (after `since`, the
    run's start, and before `seen`), as sshd reads it (expiry-time, the peer's local time) and as
    the sweeps do (EPOCH)."""
    (line,) = granted
    epoch = int(line.split()[-1].split(":")[2])
    t = re.search(r'expiry-time="([0-9]{14})"', line).group(1)
    sshd_reads = int(peer.run("env", "-u", "TZ", "date", "-d", f"{t[:8]} {t[8:10]}:{t[10:12]}:{t[12:]}",
                              "+%s").stdout)
    for deadline in (sshd_reads, epoch):
        assert since + 600 - 1 <= deadline <= seen + 600, (deadline - since, line)


def _copied_some(dest, timeout=60):
    """Wait until rsync has written a quarter of the big file on the destination."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sizes = dest.run("sh", "-c", f"stat -c %s {DEST}/.{BIG}.* 2>/dev/null || true").stdout.split()
        if any(int(s) > len(FILES[BIG]) // 4 for s in sizes):
            return True
        time.sleep(0.2)
    return False
