"""Upgrades on a bare sandbox host: each SGLang version a stack (an immutable venv built by uv),
a diff patch carried from 0.5.23 to 0.5.24, a failing 0.5.25 rolled back without an install
call, refusals before anything changes, manual rollback across versions, pruning, weights.

The simulator reports what it really imported: `model_code` (the patched line) and
`model_code_version` (the FILE_VERSION of the upstream file the patch was applied to)."""
import json
import shutil
import subprocess
import sys
import time

import pytest

from sandbox import provision
from specops.sglang import patchfile
from support import ROOT
from support.hosts import unit_prop
from support.stacks import info, run, venv_for

pytestmark = pytest.mark.fleet
SIM = provision.SIM_SRC
LLAMA = "srt/models/llama.py"
UPSTREAM = {"0.5.23": (SIM / "sglang" / LLAMA).read_text(),
            "0.5.24": (SIM / "versions/0.5.24/sglang" / LLAMA).read_text()}
UV_LOG = "/var/log/uv-calls.log"
RELEASES = "/var/lib/specops/releases"


def diff_patch(root, line='MODEL_CODE = "patched: diff"', old='MODEL_CODE = "upstream"', also=None):
    """A diff cut against 0.5.23's llama.py, written where the inventory's patch_dir says."""
    edited = UPSTREAM["0.5.23"].replace(old, line)
    if also:
        edited = edited.replace(*also)
    path = root / (LLAMA + ".patch")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(patchfile.make(LLAMA, UPSTREAM["0.5.23"], edited, "0.5.23",
                                   patchfile.upstream_sha256(UPSTREAM["0.5.23"].encode())))
    return path


def host_vars(index, version, patch_dir, patches=(LLAMA + ".patch",), svc=None, **extra):
    svc = provision.bare_service(patches=list(patches), **(svc or {}))
    return {"services": [svc], "sglang": {"version": version}, "patch_dir": str(patch_dir),
            "torch": {"version": "2.9.1", "cuda": "auto", "index_url": f"{index.url}/whl/{{variant}}"},
            "package_index": f"{index.url}/simple", **extra}


def running(h):
    i = info(h)
    return i["model_code"], i.get("model_code_version")


def count_uv(h, slow=0):
    """Every uv call on the host, logged by a wrapper in front of the pinned uv (and no pip is in a
    stack: uv venv seeds none, so a stack cannot be changed by pip behind uv's back).  `slow`:
    seconds each `uv pip` waits first, so a test can interrupt a build while it runs."""
    uv = f"/var/lib/specops/tools/uv-{stack_uv_pin()}/bin/uv"
    if not h.path(uv + ".real").exists():
        h.run("mv", uv, uv + ".real")
    h.path(uv).write_text(f"#!/bin/sh\necho \"$(date +%s.%N) $*\" >> {UV_LOG}\n"
                          f"[ \"$1\" = pip ] && sleep {slow}\nexec {uv}.real \"$@\"\n")
    h.run("chmod", "755", uv)
    h.run("rm", "-f", UV_LOG)


def stack_uv_pin():
    from specops.layout import UV_PIN
    return UV_PIN


def uv_calls(h):
    log = h.path(UV_LOG)
    return log.read_text().splitlines() if log.exists() else []


def current(h):
    return h.run("readlink", f"{RELEASES}/current").stdout.strip()


def manifest(h, stamp):
    return json.loads(h.path(f"{RELEASES}/{stamp}/manifest.json").read_text())


_UPGRADED = {}


@pytest.fixture
def upgraded(sandbox, pkg_index, tmp_path_factory):
    """t4 bootstrapped on 0.5.23 with a diff patch, then upgraded to 0.5.24 (each run twice); made
    once for this file's tests, which go on from one another's state in order."""
    if not _UPGRADED:
        _UPGRADED.update(_upgrade(sandbox, pkg_index, tmp_path_factory))
    return _UPGRADED


def _upgrade(sandbox, pkg_index, tmp_path_factory):
    patches = tmp_path_factory.mktemp("patches")
    diff_patch(patches)
    h = sandbox.reset("t4", layers=[provision.layer("bare")])
    v23, v24 = host_vars(pkg_index, "0.5.23", patches), host_vars(pkg_index, "0.5.24", patches)
    res, rep = run(sandbox, "t4", v23, task="bootstrap")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert running(h) == ("patched: diff", "0.5.23")
    res, rep = run(sandbox, "t4", v23)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]
    first = current(h)
    res, rep = run(sandbox, "t4", v24)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    return {"h": h, "v23": v23, "v24": v24, "patches": patches, "first": first, "upgrade": res.stdout,
            "second": current(h)}


@pytest.mark.reliability("second-run", "idempotence")
def test_upgrade_carries_the_diff_patch_and_keeps_the_old_stack(sandbox, upgraded):
    h, v23, v24 = upgraded["h"], upgraded["v23"], upgraded["v24"]
    assert running(h) == ("patched: diff", "0.5.24")  # 0.5.24's own file, with the patch applied
    # the same on disk, whatever a server reports: the stack's file is 0.5.24's, patched
    diff = (upgraded["patches"] / (LLAMA + ".patch")).read_text()
    for version, hv in (("0.5.24", v24), ("0.5.23", v23)):
        on_disk = h.path(f"{venv_for(hv)}/lib/python3.11/site-packages/sglang/{LLAMA}").read_text()
        assert on_disk == patchfile.apply(diff, UPSTREAM[version], LLAMA, version), version
    assert venv_for(v23) != venv_for(v24)
    for venv in (venv_for(v23), venv_for(v24)):
        assert h.path(f"{venv}/specops-stack.json").exists(), (
            venv, h.run("ls", "-la", "/opt/specops/venvs").stdout,
            h.run("sh", "-c", f"cat {RELEASES}/*/manifest.json | grep -E 'venv|stamp|status'").stdout,
            upgraded["upgrade"][-6000:])
    unit = h.path("/etc/systemd/system/sglang.service").read_text()
    assert f"{venv_for(v24)}/bin/python" in unit and venv_for(v23) not in unit
    assert manifest(h, upgraded["second"])["venv"] == venv_for(v24)
    assert manifest(h, upgraded["first"])["venv"] == venv_for(v23)
    # the 0.5.24 stack shares torch with the 0.5.23 one: hard links from uv's cache, not a copy
    torch_init = "lib/python3.11/site-packages/torch/__init__.py"
    inodes = {h.run("stat", "-c", "%i", f"{v}/{torch_init}").stdout.strip() for v in (venv_for(v23), venv_for(v24))}
    assert len(inodes) == 1, inodes
    # issue 38: the new stack is said by the versions it moves, not only by its hash
    assert "sglang 0.5.23 → 0.5.24; build with uv: " in upgraded["upgrade"], upgraded["upgrade"][-6000:]
    res, rep = run(sandbox, "t4", v24)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]
    res, _ = run(sandbox, "t4", v24, task="releases")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stacks: 2 kept" in res.stdout and "GiB on disk together" in res.stdout, res.stdout
    assert f"{'':<14} stack: sglang 0.5.23 → 0.5.24" in res.stdout, res.stdout


@pytest.mark.reliability("start-failure", "fault")
def test_failing_version_rolls_back_to_the_previous_stack_without_an_install(sandbox, pkg_index, upgraded):
    h, v24 = upgraded["h"], upgraded["v24"]
    v25 = host_vars(pkg_index, "0.5.25", upgraded["patches"])
    count_uv(h)
    res, rep = run(sandbox, "t4", v25)
    assert res.returncode == 1
    out = res.stdout
    assert "ROLLING BACK" in out and "verified" in rep["error"], out[-3000:]
    assert f"rolled back to {upgraded['second']}, verified" in rep["error"]
    calls = uv_calls(h)
    # the two calls that built 0.5.25's stack, both before the rollback began; none after it
    assert [c.split()[1:3] for c in calls] == [["venv", "--quiet"], ["pip", "install"]], calls
    assert running(h) == ("patched: diff", "0.5.24")
    assert current(h) == upgraded["second"]
    assert f"{venv_for(v24)}/bin/python" in h.path("/etc/systemd/system/sglang.service").read_text()
    res, _ = run(sandbox, "t4", v24, task="status")
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(l for l in res.stdout.splitlines() if l.startswith("t4 ") and "sglang" in l)
    assert " none " in line, res.stdout
    assert f"t4: sglang runs sglang 0.5.24 from stack {venv_for(v24)} (release {upgraded['second']})\n" in res.stdout
    assert f"t4: current release {upgraded['second']}; 2 stack(s) kept" in res.stdout, res.stdout
    assert not h.path(venv_for(v25)).exists()  # no kept release runs it (the undone one names none)
    res, rep = run(sandbox, "t4", v24)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]


def test_manual_rollback_across_a_version_and_back(sandbox, upgraded):
    h, v24 = upgraded["h"], upgraded["v24"]
    count_uv(h)
    t0 = time.monotonic()
    res, rep = run(sandbox, "t4", v24, task="rollback")
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-3000:]
    assert running(h) == ("patched: diff", "0.5.23") and current(h) == upgraded["first"]
    # status names what the unit runs (the inventory still asks for 0.5.24's stack), not what it asks for
    res, _ = run(sandbox, "t4", v24, task="status")
    assert (f"t4: sglang runs sglang 0.5.23 from stack {venv_for(upgraded['v23'])} (release {upgraded['first']}); "
            f"the inventory asks for stack {venv_for(v24)}: to run it, inv deploy --host t4") in res.stdout, res.stdout
    # issue 38: the release the rollback left is listed rolled back, not "deployed"
    res, _ = run(sandbox, "t4", v24, task="releases")
    assert f" {upgraded['second']}  rolled-back " in res.stdout, res.stdout
    assert f"rolled back to {upgraded['first']}" in res.stdout, res.stdout
    res, rep = run(sandbox, "t4", v24, "--to", upgraded["second"], task="rollback")
    assert res.returncode == 0, res.stdout[-3000:]
    assert running(h) == ("patched: diff", "0.5.24") and current(h) == upgraded["second"]
    res, _ = run(sandbox, "t4", v24, task="releases")
    assert f"* {upgraded['second']}  deployed " in res.stdout, res.stdout  # current again: no longer rolled back
    assert uv_calls(h) == []
    print(f"BENCH rollback across a version: {took:.1f} s")


def test_a_diff_that_does_not_apply_is_refused_before_any_change(sandbox, pkg_index, upgraded, tmp_path):
    h = upgraded["h"]
    bad = tmp_path / "bad"
    # also touches ENTRY_CLASSES, which 0.5.24 changed: the hunk cannot apply there
    diff_patch(bad, also=('ENTRY_CLASSES = "LlamaForCausalLM"', 'ENTRY_CLASSES = "LlamaForCausalLM"  # ours'))
    before = snapshot(h)
    # against a stack still to be built (its files read from the wheel: nothing moves) and a built one
    for hv in (host_vars(pkg_index, "0.5.24", bad, packages=["tqdm==4.70.1"]), host_vars(pkg_index, "0.5.24", bad)):
        res, rep = run(sandbox, "t4", hv)
        assert res.returncode == 1
        assert "hunk 1 of 1 (@@ -3,9 +3,9 @@) does not apply to sglang 0.5.24's srt/models/llama.py" in rep["error"], \
            rep["error"]
        assert "\n" not in rep["error"]
        assert snapshot(h) == before


def test_a_whole_file_cut_from_another_version_is_refused(sandbox, pkg_index, upgraded, tmp_path):
    h = upgraded["h"]
    whole = tmp_path / "whole" / LLAMA
    whole.parent.mkdir(parents=True)
    whole.write_text("# specops-base: sglang 0.5.23\n" + UPSTREAM["0.5.23"].replace("upstream", "whole"))
    before = snapshot(h)
    for extra in ({"packages": ["tqdm==4.70.1"]}, {}):  # a stack still to be built, and a built one
        hv = host_vars(pkg_index, "0.5.24", tmp_path / "whole", patches=[LLAMA], **extra)
        res, rep = run(sandbox, "t4", hv)
        assert res.returncode == 1
        assert "0.5.23" in rep["error"] and "0.5.24" in rep["error"], rep["error"]
        assert snapshot(h) == before
    res, rep = run(sandbox, "t4", {**hv, "patch_any_base": True}, "--check")
    assert res.returncode == 0, res.stdout[-2000:]


def snapshot(h, strict=True):
    """What serves: the unit, env and launcher, every stack's patched file, the releases, the start;
    `strict`: and every file under /opt/specops and specops's tools, by name and size."""
    files = ["/etc/systemd/system/sglang.service", "/etc/specops/sglang.env", "/usr/local/lib/specops/launch.py"]
    files += h.run("sh", "-c", f"ls -d /opt/specops/venvs/*/lib/python3.11/site-packages/sglang/{LLAMA}"
                   ).stdout.split()
    return {"sha": h.run("sha256sum", *files).stdout, "releases": h.run("ls", RELEASES).stdout,
            "started": unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic"),
            # every file specops keeps stacks, uv and its tools in, by name and size: a build moves bytes there
            "stacks": h.run("sh", "-c", "find /opt/specops /var/lib/specops/tools -xdev -printf '%p %s\n' | sort"
                            " | sha256sum").stdout if strict else None}


def test_weights_changed_under_a_running_server(sandbox, pkg_index, upgraded, tmp_path):
    """Weights pushed by a deploy that was then refused (a bad patch) changed under the running
    server: status and verify say so; the next deploy restarts it and records a release."""
    h = upgraded["h"]
    weights = tmp_path / "tiny-llama"
    shutil.copytree(provision.controller_models() / "tiny-llama", weights)
    config = json.loads((weights / "config.json").read_text())
    (weights / "config.json").write_text(json.dumps({**config, "specops_test_revision": 2}, indent=2))
    bad = tmp_path / "bad"
    diff_patch(bad, also=('ENTRY_CLASSES = "LlamaForCausalLM"', 'ENTRY_CLASSES = "LlamaForCausalLM"  # ours'))
    source = {"weights": {"source": "controller", "path": str(weights)}}
    started = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic")
    res, rep = run(sandbox, "t4", host_vars(pkg_index, "0.5.24", bad, svc=source))
    assert res.returncode == 1 and "does not apply" in rep["error"], res.stdout[-2000:]
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") == started  # not restarted: old weights
    good = host_vars(pkg_index, "0.5.24", upgraded["patches"], svc=source)
    res, _ = run(sandbox, "t4", good, task="status")
    line = next(l for l in res.stdout.splitlines() if l.startswith("t4 ") and "sglang" in l)
    assert "weights changed since the server started (/models/tiny-llama)" in line, res.stdout
    res, rep = run(sandbox, "t4", good, task="verify")
    assert res.returncode == 1 and "weights changed since the server started" in res.stdout, res.stdout[-2000:]
    before = current(h)
    res, rep = run(sandbox, "t4", good)
    assert res.returncode == 0, res.stdout[-3000:]
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") != started
    after = current(h)
    assert after != before  # a release of its own: what runs changed
    recorded = manifest(h, after)["weights"]["/models/tiny-llama"]
    assert recorded["digest"] and recorded["digest"] != manifest(h, before)["weights"]["/models/tiny-llama"]["digest"]
    res, rep = run(sandbox, "t4", good)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]
    # back to a release that ran other weights: said in one line, not claimed restored
    res, rep = run(sandbox, "t4", good, task="rollback")
    assert res.returncode == 0, res.stdout[-3000:]
    said = [l for l in res.stdout.splitlines() if l.split()[1:2] == ["weights"]]  # its line (the recap repeats it)
    assert len(said) == 1 and "/models/tiny-llama" in said[0], res.stdout
    res, rep = run(sandbox, "t4", good, "--to", after, task="rollback")
    assert res.returncode == 0 and "rollback does not restore weights" not in res.stdout, res.stdout[-3000:]


def test_a_stack_goes_only_when_no_kept_release_names_it(sandbox, pkg_index, upgraded):
    h, v23, v24 = upgraded["h"], upgraded["v23"], upgraded["v24"]
    other = dict(v24, packages=["tqdm==4.70.1"])  # a third stack: only one more pin
    for hv in (other, v23):
        res, rep = run(sandbox, "t4", hv)
        assert res.returncode == 0, res.stdout[-3000:]
    assert h.path(venv_for(other)).exists() and h.path(venv_for(v24)).exists()
    for i in range(4):  # releases of v23 alone (a unit change each) push the older ones out
        hv = dict(v23, services=[dict(v23["services"][0], env={"SGLANG_SIM_STARTUP_DELAY": "0", "N": str(i)})])
        res, rep = run(sandbox, "t4", hv)
        assert res.returncode == 0, res.stdout[-3000:]
        named = {manifest(h, s).get("venv") for s in h.run("ls", RELEASES).stdout.split() if s != "current"}
        for venv in (venv_for(other), venv_for(v24), venv_for(v23)):
            assert h.path(venv).exists() == (venv in named), (i, venv, named)
    assert not h.path(venv_for(other)).exists() and not h.path(venv_for(v24)).exists()
    assert h.path(venv_for(v23)).exists()
    # the previous release's stack stays while current runs another
    res, rep = run(sandbox, "t4", v24)
    assert res.returncode == 0, res.stdout[-3000:]
    assert h.path(venv_for(v24)).exists() and h.path(venv_for(v23)).exists()
    assert running(h) == ("patched: diff", "0.5.24")
    res, rep = run(sandbox, "t4", v24)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]


def test_a_stack_the_disk_cannot_hold_is_refused_before_a_byte_moves(sandbox, pkg_index, upgraded):
    h = upgraded["h"]
    hv = dict(upgraded["v24"], packages=["tqdm==4.70.1"], stack_need_gib=1e6)
    before = snapshot(h)
    res, rep = run(sandbox, "t4", hv)
    assert res.returncode == 1
    assert "needs 1000000.0 GiB free on /opt/specops/venvs" in rep["error"] and "GiB free" in rep["error"], rep["error"]
    assert snapshot(h) == before
    assert not h.path(venv_for(hv)).exists()
    assert h.run("sh", "-c", "ls -a /opt/specops/venvs | grep -c build || true").stdout.strip() == "0"


@pytest.mark.reliability("sigint", "fault")
def test_ctrl_c_while_a_stack_builds_leaves_the_previous_release_serving(sandbox, pkg_index, upgraded):
    h = upgraded["h"]
    hv = dict(upgraded["v24"], packages=["tqdm==4.70.1"])
    before = snapshot(h, strict=False)  # uv's cache and its wrapper move: what serves must not
    count_uv(h, slow=30)
    code, out = sandbox.interrupt("deploy", "--host", "t4", inventory=sandbox.inventory({"t4": hv}, {"venv": None}),
                                  when="build stack /opt", before=lambda: time.sleep(2))
    count_uv(h)
    assert code != 0 and "+ tqdm" not in out, out[-2000:]
    assert snapshot(h, strict=False) == before, out[-3000:]
    assert running(h) == ("patched: diff", "0.5.24")
    assert h.run("sh", "-c", "ls -a /opt/specops/venvs | grep -c build || true").stdout.strip() == "0", out[-2000:]
    res, rep = run(sandbox, "t4", hv)
    assert res.returncode == 0, res.stdout[-3000:]
    res, rep = run(sandbox, "t4", hv)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]


@pytest.mark.reliability("ssh-cut", "fault")
def test_a_connection_cut_while_a_stack_builds_leaves_the_previous_release_serving(sandbox, pkg_index, upgraded):
    import threading
    h = upgraded["h"]
    hv = dict(upgraded["v24"], packages=["tqdm==4.70.1", "setproctitle==1.3.6"])
    before = snapshot(h, strict=False)
    count_uv(h, slow=30)
    results = {}
    t = threading.Thread(target=lambda: results.update(r=run(sandbox, "t4", hv)))
    t.start()
    building = lambda: h.run(  # noqa: E731
        "sh", "-c", "ls -a /opt/specops/venvs | grep -c '^.build-' || true").stdout.strip()
    deadline = time.monotonic() + 60
    while building() == "0" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert building() == "1", "the build never began"
    h.run("pkill", "-KILL", "-f", "sshd: root@notty")  # cut the connection
    t.join(120)
    count_uv(h)
    res, rep = results["r"]
    assert res.returncode != 0
    deadline = time.monotonic() + 10
    while building() != "0" and time.monotonic() < deadline:
        time.sleep(0.2)  # the agent ends its command and removes the build when its channel goes
    assert building() == "0"
    assert snapshot(h, strict=False) == before and running(h) == ("patched: diff", "0.5.24")
    res, rep = run(sandbox, "t4", hv)
    assert res.returncode == 0, res.stdout[-3000:]
    res, rep = run(sandbox, "t4", hv)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]


def test_inv_patch_writes_a_diff_and_rebases_it_locally(sandbox, pkg_index, upgraded, tmp_path):
    h = upgraded["h"]
    patches = tmp_path / "p"
    v23 = dict(upgraded["v23"], patch_dir=str(patches))
    inv23 = sandbox.inventory({"t4": v23}, {"venv": None})
    work = tmp_path / "work"
    work.mkdir()
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "patch", "--host", "t4", LLAMA, "--fetch"],
                         cwd=work, capture_output=True, text=True, env={**_env(), "SPECOPS_INVENTORY": str(inv23)})
    assert res.returncode == 0, res.stdout + res.stderr
    fetched = work / "llama.py"
    assert fetched.read_text() == UPSTREAM["0.5.23"]
    fetched.write_text(fetched.read_text().replace('MODEL_CODE = "upstream"', 'MODEL_CODE = "patched: made"'))
    before = snapshot(h)
    res = sandbox.inv("patch", "--host", "t4", LLAMA, "--edited", str(fetched), inventory=inv23)
    assert res.returncode == 0, res.stdout + res.stderr
    made = patches / (LLAMA + ".patch")
    assert made.read_text().startswith("# specops-base: sglang 0.5.23")
    # rebased onto the stack the inventory now asks for (0.5.24, built on the host)
    inv24 = sandbox.inventory({"t4": dict(upgraded["v24"], patch_dir=str(patches))}, {"venv": None})
    res = sandbox.inv("patch", "--host", "t4", LLAMA, "--rebase", inventory=inv24)
    assert res.returncode == 0, res.stdout + res.stderr
    rebased = (patches / (LLAMA + ".patch.0.5.24")).read_text()
    assert patchfile.base_of(rebased).version == "0.5.24"
    assert 'MODEL_CODE = "patched: made"' in patchfile.apply(rebased, UPSTREAM["0.5.24"], LLAMA, "0.5.24")
    # the same onto a stack not built yet: 0.5.24's file read from its wheel, in memory on the host
    unbuilt = dict(upgraded["v24"], patch_dir=str(patches), packages=["setproctitle==1.3.6"])
    assert not h.path(venv_for(unbuilt)).exists()
    (patches / (LLAMA + ".patch.0.5.24")).unlink()
    res = sandbox.inv("patch", "--host", "t4", LLAMA, "--rebase", inventory=sandbox.inventory({"t4": unbuilt},
                                                                                              {"venv": None}))
    assert res.returncode == 0, res.stdout + res.stderr
    assert (patches / (LLAMA + ".patch.0.5.24")).read_text() == rebased
    assert not h.path(venv_for(unbuilt)).exists()
    # a change to a line 0.5.24 also changed: conflicts, written for review, exit 1
    made.write_text(patchfile.make(LLAMA, UPSTREAM["0.5.23"], UPSTREAM["0.5.23"].replace(
        'ENTRY_CLASSES = "LlamaForCausalLM"', 'ENTRY_CLASSES = "LlamaForCausalLM, Ours"'), "0.5.23",
        patchfile.upstream_sha256(UPSTREAM["0.5.23"].encode())))
    res = sandbox.inv("patch", "--host", "t4", LLAMA, "--rebase", inventory=inv24)
    assert res.returncode == 1 and "conflict" in res.stdout + res.stderr, res.stdout + res.stderr
    merged = (patches / "srt/models/llama.py.merge-0.5.24").read_text()
    assert "<<<<<<<" in merged and ">>>>>>>" in merged
    assert snapshot(h) == before  # nothing written onto the host


def _env():
    import os
    return dict(os.environ)
