"""Issue 36 item 5, "weights, too, are what runs", as a colleague tried it on the sandbox hub: a
shard rewritten on the host, by hand or by specops, after or before the server started; and a
new commit that leaves config.json as it was.  Each case says what status and verify print, and
whether the next deploy restarts the server and records a release."""
import hashlib
import os
import shutil

import pytest

from sandbox import hub as hub_mod
from support.hosts import unit_prop
from support.weights import TARGET, host_sha256, hub_service, hub_sha256, run

pytestmark = pytest.mark.fleet
SHARD, OTHER = "model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"
LABEL = f"weights sandbox/tiny-llama@main in {TARGET}"
RELEASES = "/var/lib/specops/releases"


def current(h):
    return h.run("readlink", f"{RELEASES}/current").stdout.strip()


def row(res, name):
    """The host's row of the status table."""
    return next(line for line in res.stdout.splitlines() if line.startswith(f"{name} ") and "sglang" in line)


def overwrite(h):
    """The shard overwritten by hand with other bytes of its size (the other shard's), as a
    colleague's `cp` does; returns its stat from before."""
    path = h.path(f"{TARGET}/{SHARD}")
    st = os.stat(path)
    h.run("cp", f"{TARGET}/{OTHER}", f"{TARGET}/{SHARD}")
    assert os.stat(path).st_size == st.st_size
    return st


def restarted_with_the_hubs_bytes(sandbox, hub, h, name, started, before):
    """The deploy after it: the shard fetched again, the server restarted, a release recorded;
    then status says none and verify passes."""
    res, rep = run(sandbox, name, hub_service(hub))
    assert res.returncode == 0, res.stdout[-3000:]
    assert f"{SHARD} differs: fetched again" in res.stdout
    assert f"running code of sglang: changed (weights changed since the server started ({TARGET}); restart)" \
        in res.stdout, res.stdout[-3000:]
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") != started
    assert current(h) != before and any(n.startswith("release ") for n in rep["notes"]), rep["notes"]
    assert host_sha256(h, TARGET, [SHARD])[SHARD] == hub_sha256("sandbox/tiny-llama")[SHARD]
    res, rep = run(sandbox, name, hub_service(hub), "status")
    assert res.returncode == 0 and " none " in row(res, name), res.stdout
    (svc,) = rep["status"]["services"]
    assert svc["drift"] == [] and svc["stale"] == [], svc
    res, rep = run(sandbox, name, hub_service(hub), "verify")
    assert res.returncode == 0, res.stdout[-3000:]


def test_a_shard_overwritten_then_the_server_restarted_by_hand_fails_verify_and_the_deploy_restarts_it(sandbox, hub):
    """(a) Seen before the fix: status said only the drift, verify passed, and the deploy put the
    hub's bytes back with `running code of sglang: ok` and no restart, the server still running
    the edited bytes.  Red on that code at the STALE words in status, verify's exit status, and
    the deploy's `running code of sglang: changed (...)`."""
    h = sandbox.reset("t1")
    res, _ = run(sandbox, "t1", hub_service(hub))
    assert res.returncode == 0, res.stdout[-3000:]
    overwrite(h)
    h.run("systemctl", "restart", "sglang")  # by hand, as after a crash: it loads the edited shard
    started, before = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic"), current(h)

    res, rep = run(sandbox, "t1", hub_service(hub), "status")
    assert res.returncode == 0, res.stdout[-3000:]
    line = row(res, "t1")
    assert f"{LABEL}: 1 file(s) changed on the host" in line, res.stdout
    assert f"STALE: running weights that differ from their manifest ({TARGET}: 1 file(s) changed on the host); " \
           f"restart" in line, res.stdout
    (svc,) = rep["status"]["services"]
    assert svc["stale"] == [f"running weights that differ from their manifest ({TARGET}: 1 file(s) changed on the "
                            f"host); restart"]

    res, rep = run(sandbox, "t1", hub_service(hub), "verify")
    assert res.returncode == 1, res.stdout[-3000:]
    assert f"FAILED weights differ from their manifest: {TARGET}/{SHARD} changed on the host before the server " \
           f"started (at " in res.stdout, res.stdout[-3000:]
    assert "a deploy puts back the manifest's and restarts it" in rep["error"], rep["error"]
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") == started  # verify restarts nothing

    restarted_with_the_hubs_bytes(sandbox, hub, h, "t1", started, before)


def test_a_shard_edited_with_its_mtime_moved_back_under_a_running_server_is_said_as_the_docs_say(sandbox, hub):
    """(b) Seen before the fix: status said only `1 file(s) changed on the host`, not the
    documented "weights changed since the server started", and verify passed.  Red on that code
    at the STALE words in status and at verify's exit status."""
    h = sandbox.reset("t2")
    res, _ = run(sandbox, "t2", hub_service(hub))
    assert res.returncode == 0, res.stdout[-3000:]
    started, before = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic"), current(h)
    st = overwrite(h)
    os.utime(h.path(f"{TARGET}/{SHARD}"), ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # moved back, before the start

    res, rep = run(sandbox, "t2", hub_service(hub), "status")
    assert res.returncode == 0, res.stdout[-3000:]
    line = row(res, "t2")
    assert f"{LABEL}: 1 file(s) changed on the host" in line, res.stdout
    assert f"STALE: weights changed since the server started ({TARGET}); restart" in line, res.stdout

    res, rep = run(sandbox, "t2", hub_service(hub), "verify")
    assert res.returncode == 1, res.stdout[-3000:]
    assert "FAILED weights changed since the server started: it started at " in res.stdout, res.stdout[-3000:]
    assert f", the weights in {TARGET} ({SHARD}) changed at " in rep["error"], rep["error"]
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") == started

    restarted_with_the_hubs_bytes(sandbox, hub, h, "t2", started, before)


MOVING = "sandbox/moving-llama"


def test_a_new_commit_fetches_only_the_shard_it_changed_not_the_unchanged_config(sandbox, hub):
    """(c) Seen before the fix: `--verify-weights` after a new commit fetched config.json again
    (`config.json differs: fetched again`): a file not in LFS has no sha256 from the hub.  It is
    compared by its git blob sha1 now.  Red on that code at the config.json line and at the bytes
    served (config.json's more)."""
    repo = hub.dir / "mirrors" / "models" / MOVING
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(hub.dir / "mirrors" / "models" / "sandbox/tiny-llama", repo)  # its own history from here
    h = sandbox.reset("t3")
    svc = hub_service(hub, repo=MOVING)
    res, _ = run(sandbox, "t3", svc)
    assert res.returncode == 0, res.stdout[-3000:]
    first = hub_mod._git(repo, "rev-parse", "HEAD")

    # The next commit changes the second shard (an LFS object), nothing else.
    data = hub_mod.safetensors("target-2, second commit", 1 << 20)
    oid = hashlib.sha256(data).hexdigest()
    obj = repo / ".git/lfs/objects" / oid[:2] / oid[2:4] / oid
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(data)
    (repo / SHARD).write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n")
    hub_mod._git(repo, "commit", "-qam", "a new second shard")
    second = hub_mod._git(repo, "rev-parse", "HEAD")
    assert second != first
    started, served = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic"), hub.served()

    res, rep = run(sandbox, "t3", svc, "deploy", "--verify-weights")
    assert res.returncode == 0, res.stdout[-3000:]
    assert f"{SHARD} differs: fetched again" in res.stdout, res.stdout[-3000:]
    assert "config.json differs: fetched again" not in res.stdout, res.stdout[-3000:]
    assert f"weights {MOVING}@main ({second[:12]}): 3 file(s)" in res.stdout, res.stdout[-3000:]
    assert hub.served() - served == len(data)  # that shard only
    assert host_sha256(h, TARGET, [SHARD, "config.json"]) == {
        SHARD: oid, "config.json": hub_sha256("sandbox/tiny-llama")["config.json"]}
    # new content: restarted, a release of its own
    assert f"running code of sglang: changed (weights changed since the server started ({TARGET}); restart)" \
        in res.stdout
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") != started
    assert any(n.startswith("release ") for n in rep["notes"]), rep["notes"]
