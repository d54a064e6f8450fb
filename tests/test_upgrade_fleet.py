"""Upgrades on a bare sandbox host: each SGLang version a stack (an immutable venv built by uv),
a diff patch carried from 0.5.23 to 0.5.24, a failing 0.5.25 rolled back without an install
call, refusals before anything changes, manual rollback across versions, pruning, weights.

The simulator reports what it really imported: `model_code` (the patched line) and
`model_code_version` (the FILE_VERSION of the upstream file the patch was applied to)."""
import json
import time

import pytest

from conftest import load_json, unit_prop
from sandbox import provision
from specops.sglang import patchfile, stack

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


def host_vars(index, version, patch_dir, patches=(LLAMA + ".patch",), **extra):
    svc = provision.bare_service(patches=list(patches))
    return {"services": [svc], "sglang": {"version": version}, "patch_dir": str(patch_dir),
            "torch": {"version": "2.9.1", "cuda": "auto", "index_url": f"{index.url}/whl/{{variant}}"},
            "package_index": f"{index.url}/simple", **extra}


def venv_for(hv):
    return stack.venv_of(hv)


def run(sandbox, name, hv, *args, task="deploy", timeout=600):
    inv = sandbox.inventory({name: hv}, group_vars={"venv": None})
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    json_arg = ["--json", str(report)] if task != "releases" else []
    res = sandbox.inv(task, "--host", name, *args, *json_arg, inventory=inv, timeout=timeout)
    return res, (load_json(report)["hosts"][name] if report.exists() else None)


def info(h):
    return json.loads(h.run("curl", "-sf", "http://127.0.0.1:30000/model_info").stdout)


def running(h):
    i = info(h)
    return i["model_code"], i.get("model_code_version")


def count_uv(h):
    """Every uv call on the host, logged by a wrapper in front of the pinned uv (and no pip is in a
    stack: uv venv seeds none, so a stack cannot be changed by pip behind uv's back)."""
    uv = f"/var/lib/specops/tools/uv-{stack_uv_pin()}/bin/uv"
    if not h.path(uv + ".real").exists():
        h.run("mv", uv, uv + ".real")
        h.path(uv).write_text(f"#!/bin/sh\necho \"$(date +%s.%N) $*\" >> {UV_LOG}\nexec {uv}.real \"$@\"\n")
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


def test_upgrade_carries_the_diff_patch_and_keeps_the_old_stack(sandbox, upgraded):
    h, v23, v24 = upgraded["h"], upgraded["v23"], upgraded["v24"]
    assert running(h) == ("patched: diff", "0.5.24")  # 0.5.24's own file, with the patch applied
    assert venv_for(v23) != venv_for(v24)
    for venv in (venv_for(v23), venv_for(v24)):
        assert h.path(f"{venv}/specops-stack.json").exists(), (venv, h.run("ls", "-la", "/opt/specops/venvs").stdout,
                                                              h.run("sh", "-c", f"cat {RELEASES}/*/manifest.json | grep -E 'venv|stamp|status'").stdout, upgraded["upgrade"][-6000:])
    unit = h.path("/etc/systemd/system/sglang.service").read_text()
    assert f"{venv_for(v24)}/bin/python" in unit and venv_for(v23) not in unit
    assert manifest(h, upgraded["second"])["venv"] == venv_for(v24)
    assert manifest(h, upgraded["first"])["venv"] == venv_for(v23)
    # the 0.5.24 stack shares torch with the 0.5.23 one: hard links from uv's cache, not a copy
    torch_init = "lib/python3.11/site-packages/torch/__init__.py"
    inodes = {h.run("stat", "-c", "%i", f"{v}/{torch_init}").stdout.strip() for v in (venv_for(v23), venv_for(v24))}
    assert len(inodes) == 1, inodes
    res, rep = run(sandbox, "t4", v24)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]
    res, _ = run(sandbox, "t4", v24, task="releases")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stacks: 2 kept" in res.stdout and "GiB on disk together" in res.stdout, res.stdout


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
    res, rep = run(sandbox, "t4", v24, "--to", upgraded["second"], task="rollback")
    assert res.returncode == 0, res.stdout[-3000:]
    assert running(h) == ("patched: diff", "0.5.24") and current(h) == upgraded["second"]
    assert uv_calls(h) == []
    print(f"BENCH rollback across a version: {took:.1f} s")


def test_a_diff_that_does_not_apply_is_refused_before_any_change(sandbox, pkg_index, upgraded, tmp_path):
    h = upgraded["h"]
    bad = tmp_path / "bad"
    # also touches ENTRY_CLASSES, which 0.5.24 changed: hunk 2 cannot apply there
    diff_patch(bad, also=('ENTRY_CLASSES = "LlamaForCausalLM"', 'ENTRY_CLASSES = "LlamaForCausalLM"  # ours'))
    hv = host_vars(pkg_index, "0.5.24", bad)
    before = snapshot(h)
    res, rep = run(sandbox, "t4", hv)
    assert res.returncode == 1
    assert "does not apply to sglang 0.5.24's srt/models/llama.py" in rep["error"] and "hunk" in rep["error"], \
        rep["error"]
    assert "\n" not in rep["error"]
    assert snapshot(h) == before


def test_a_whole_file_cut_from_another_version_is_refused(sandbox, pkg_index, upgraded, tmp_path):
    h = upgraded["h"]
    whole = tmp_path / "whole" / LLAMA
    whole.parent.mkdir(parents=True)
    whole.write_text("# specops-base: sglang 0.5.23\n" + UPSTREAM["0.5.23"].replace("upstream", "whole"))
    hv = host_vars(pkg_index, "0.5.24", tmp_path / "whole", patches=[LLAMA])
    before = snapshot(h)
    res, rep = run(sandbox, "t4", hv)
    assert res.returncode == 1
    assert "0.5.23" in rep["error"] and "0.5.24" in rep["error"], rep["error"]
    assert snapshot(h) == before
    res, rep = run(sandbox, "t4", {**hv, "patch_any_base": True}, "--check")
    assert res.returncode == 0, res.stdout[-2000:]


def snapshot(h):
    """What serves: the unit, env and launcher, every stack's patched file, the releases, the start."""
    files = ["/etc/systemd/system/sglang.service", "/etc/specops/sglang.env", "/usr/local/lib/specops/launch.py"]
    files += h.run("sh", "-c", f"ls -d /opt/specops/venvs/*/lib/python3.11/site-packages/sglang/{LLAMA}"
                   ).stdout.split()
    return {"sha": h.run("sha256sum", *files).stdout, "releases": h.run("ls", RELEASES).stdout,
            "started": unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic")}
