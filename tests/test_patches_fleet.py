"""Patched model files, bytecode purge and the draft config, proven on sandbox hosts.

The simulator reports MODEL_CODE from the module it really imported, so these tests see
which code the running process loaded, not which file is on disk.
"""
import json
import time

import pytest

from specops.sglang.patches import PATCH_DIR
from sandbox import provision
from sandbox.provision import VENV, sandbox_service
from support.files import load_json
from support.hosts import host_snapshot, sha256_on, unit_prop
from support.reliability import record_inputs

pytestmark = pytest.mark.fleet
LLAMA = "srt/models/llama.py"
DEEPSEEK = "srt/models/deepseek_v2.py"
SITE = f"{VENV}/lib/python3.11/site-packages/sglang"
PATCHED, UPSTREAM = "patched: embedding capture", "upstream"
IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"
DRAFT_CFG = "/models/tiny-llama-eagle3/config.json"


def model_info(h, port=30000):
    return json.loads(h.run("curl", "-sf", f"http://127.0.0.1:{port}/model_info").stdout)


def wait_ready(h, port=30000, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if h.run("curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}/health", check=False).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError("server not ready")


def deploy(sandbox, name, svc, *args, **host_vars):
    inv = sandbox.inventory({name: {"services": [svc], **host_vars}})
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    res = sandbox.inv("deploy", "--host", name, "--json", str(report), *args, inventory=inv)
    return res, (load_json(report)["hosts"][name] if report.exists() else None)


def pycs(h, directory, module="llama"):
    out = h.run("sh", "-c", f"ls {directory}/__pycache__/ 2>/dev/null", check=False).stdout.split()
    return sorted(n for n in out if n.startswith(module + "."))


@pytest.mark.reliability("second-run", "idempotence")
@pytest.mark.parametrize("trap", ["same-size-and-mtime", "unchecked-hash"])
def test_stale_bytecode_trap_both_ways(sandbox, trap):
    h = sandbox.reset("t1")
    py, target, cache = f"{VENV}/bin/python", f"{SITE}/{LLAMA}", f"{SITE}/srt/models"
    # Bytecode of the upstream file, as an earlier run or the distribution leaves it.
    if trap == "same-size-and-mtime":
        h.run(py, "-m", "compileall", "-q", target)
        h.run(py, "-m", "compileall", "-q", "-o", "1", "--invalidation-mode", "unchecked-hash", target)
    else:
        h.run(py, "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash", target)
    h.run("cp", f"{cache}/__pycache__/llama.cpython-311.pyc", f"{cache}/__pycache__/llama.cpython-312.pyc")
    planted = pycs(h, cache)
    assert "llama.cpython-311.pyc" in planted and len(planted) >= 2

    res, _ = deploy(sandbox, "t1", sandbox_service())
    assert res.returncode == 0, res.stdout
    assert model_info(h)["model_code"] == UPSTREAM

    # Control: the manual way (copy the patched file, restart, no purge) keeps the old code.
    patch = (PATCH_DIR / LLAMA).read_bytes()
    h.run("cp", "-p", target, "/root/llama.orig")
    h.path(target).write_bytes(patch)
    if trap == "same-size-and-mtime":
        assert len(patch) == h.path("/root/llama.orig").stat().st_size
        h.run("touch", "-r", "/root/llama.orig", target)
    h.run("systemctl", "restart", "sglang")
    wait_ready(h)
    assert model_info(h)["model_code"] == UPSTREAM, "the trap did not trigger: the control proves nothing"

    res, report = deploy(sandbox, "t1", sandbox_service(patches=[LLAMA]))
    assert res.returncode == 0, res.stdout
    assert model_info(h)["model_code"] == PATCHED
    state = json.loads(h.path("/var/lib/specops/state.json").read_text())
    assert set(planted) <= set(state["purges"][target]["removed"])
    assert all(p not in pycs(h, cache) for p in planted if p != "llama.cpython-311.pyc")

    before = host_snapshot(h, f"{SITE}/srt/models/llama.py")
    res, report = deploy(sandbox, "t1", sandbox_service(patches=[LLAMA]))
    assert res.returncode == 0 and report["changed"] == 0, res.stdout
    assert host_snapshot(h, f"{SITE}/srt/models/llama.py") == before


def pyc_stat(h, path):
    """(inode, PEP 552 flags) of a .pyc: a service that compiles a module writes a new file."""
    inode = h.run("stat", "-c", "%i", path).stdout.strip()
    flags = int.from_bytes(h.path(path).read_bytes()[4:8], "little")
    return inode, flags


@pytest.mark.reliability("second-run", "idempotence")
def test_the_compile_that_validated_a_patch_is_its_bytecode(sandbox):
    h = sandbox.reset("t1")
    target, pyc = f"{SITE}/{LLAMA}", f"{SITE}/srt/models/__pycache__/llama.cpython-311.pyc"
    res, _ = deploy(sandbox, "t1", sandbox_service(patches=[LLAMA]))
    assert res.returncode == 0, res.stdout
    assert model_info(h)["model_code"] == PATCHED
    state = json.loads(h.path("/var/lib/specops/state.json").read_text())
    assert state["purges"][target]["compiled"] == ["llama.cpython-311.pyc"]
    installed = pyc_stat(h, pyc)
    assert installed[1] == 3  # checked-hash: the interpreter compares it with the source on every import

    # The service used it: restarted, it did not compile the module (it would write a new file).
    h.run("systemctl", "restart", "sglang")
    wait_ready(h)
    assert model_info(h)["model_code"] == PATCHED and pyc_stat(h, pyc) == installed
    res, report = deploy(sandbox, "t1", sandbox_service(patches=[LLAMA]))
    assert res.returncode == 0 and report["changed"] == 0, res.stdout

    # Control: bytecode whose hash is not the source's is compiled again (a new file): the
    # inode check above can see a compile.
    data = bytearray(h.path(pyc).read_bytes())
    data[8] ^= 0xFF
    h.path(pyc).write_bytes(bytes(data))
    broken = pyc_stat(h, pyc)
    h.run("systemctl", "restart", "sglang")
    wait_ready(h)
    assert pyc_stat(h, pyc)[0] != broken[0], "the service did not recompile: the inode proves nothing"

    # The source edited behind specops's back, same size and mtime: checked bytecode is not run.
    h.run("sh", "-c", f"cp -p {target} /root/llama.py && "
                      f"sed -i 's/patched: embedding capture/patched: embedding CAPTURE/' {target} && "
                      f"touch -r /root/llama.py {target}")
    assert h.path(target).stat().st_size == h.path("/root/llama.py").stat().st_size
    h.run("systemctl", "restart", "sglang")
    wait_ready(h)
    assert model_info(h)["model_code"] == "patched: embedding CAPTURE"


@pytest.mark.reliability("syntax-error", "bad-input")
def test_syntax_error_refuses_the_whole_deploy(sandbox, tmp_path, record_property):
    record_inputs(record_property, f"a patch of {LLAMA} with a syntax error")
    h = sandbox.reset("t2")
    res, _ = deploy(sandbox, "t2", sandbox_service(patches=[LLAMA]))
    assert res.returncode == 0, res.stdout
    package = h.run("sh", "-c", f"find {SITE} -type f | sort | xargs sha256sum").stdout
    unit = sha256_on(h, "/etc/systemd/system/sglang.service", "/etc/specops/sglang.env")
    started = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic")

    broken = tmp_path / "patches" / LLAMA
    broken.parent.mkdir(parents=True)
    broken.write_text((PATCH_DIR / LLAMA).read_text() + "\ndef oops(:\n")
    # A good patch compiled before the bad one: its stage goes too.
    (tmp_path / "patches" / DEEPSEEK).write_bytes((PATCH_DIR / DEEPSEEK).read_bytes())
    # The same deploy also changes the unit (tp) and the env file: all of it must be refused.
    res, report = deploy(sandbox, "t2", sandbox_service(patches=[DEEPSEEK, LLAMA], tp=1, env_secret={"K": "v"}),
                         patch_dir=str(tmp_path / "patches"))
    assert res.returncode == 1
    assert "refused sglang/srt/models/llama.py" in report["error"] and "SyntaxError" in report["error"]
    assert h.run("sh", "-c", f"find {SITE} -type f | sort | xargs sha256sum").stdout == package
    assert sha256_on(h, "/etc/systemd/system/sglang.service", "/etc/specops/sglang.env") == unit
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") == started
    assert not h.run("find", SITE, "-name", ".specops-stage*").stdout  # no staging left behind


def test_venv_python_differs_from_host_python3(sandbox):
    """The service venv is PyPy 3.9 while python3 is CPython 3.11: the patch goes where the
    venv's interpreter imports sglang from, and that interpreter's bytecode is purged."""
    h = sandbox.reset("t3", layers=[provision.layer("pypy")])
    assert h.run("python3", "-c", "import sys; print(sys.implementation.cache_tag)").stdout.strip() == "cpython-311"
    site = f"{VENV}/lib/pypy3.9/site-packages/sglang/srt/models"
    h.run(f"{VENV}/bin/python", "-m", "compileall", "-q", f"{site}/llama.py")
    assert pycs(h, site) == ["llama.pypy39.pyc"]

    res, report = deploy(sandbox, "t3", sandbox_service(patches=[LLAMA]))
    assert res.returncode == 0, res.stdout
    assert h.path(f"{site}/llama.py").read_bytes() == (PATCH_DIR / LLAMA).read_bytes()
    assert not h.path(f"{VENV}/lib/python3.11").exists()  # nothing guessed from python3's version
    state = json.loads(h.path("/var/lib/specops/state.json").read_text())
    assert state["purges"][f"{site}/llama.py"]["removed"] == ["llama.pypy39.pyc"]
    assert model_info(h)["model_code"] == PATCHED


def test_status_reports_drift_after_pip_reinstall(sandbox):
    h = sandbox.reset("t4")
    svc = sandbox_service(patches=[LLAMA])
    res, _ = deploy(sandbox, "t4", svc)
    assert res.returncode == 0, res.stdout
    inv = sandbox.inventory({"t4": {"services": [svc]}})
    clean = sandbox.inv("status", "--host", "t4", inventory=inv)
    assert clean.returncode == 0 and "none" in clean.stdout.splitlines()[1], clean.stdout

    # A pip upgrade (here, a forced reinstall) puts the upstream file back.
    wheel = h.run("sh", "-c", "ls /opt/specops-sim/sglang-*.whl").stdout.strip()
    h.run(f"{VENV}/bin/pip", "install", "-q", "--no-index", "--force-reinstall", "--no-deps", wheel)
    report = sandbox.tmp / "status.json"
    drift = sandbox.inv("status", "--host", "t4", "--json", str(report), inventory=inv)
    assert drift.returncode == 0
    row = drift.stdout.splitlines()[1]
    assert "sglang/srt/models/llama.py: update" in row, drift.stdout
    (svc_status,) = load_json(report)["hosts"]["t4"]["status"]["services"]
    assert any("llama.py" in d for d in svc_status["drift"])

    res, _ = deploy(sandbox, "t4", svc)
    assert res.returncode == 0 and model_info(h)["model_code"] == PATCHED


@pytest.mark.reliability("second-run", "idempotence")
def test_draft_config_edit_is_idempotent_with_backup(sandbox):
    h = sandbox.reset("t5")
    before = h.path(DRAFT_CFG).read_text()
    svc = sandbox_service(patches=[LLAMA], draft_config={IDS: [-1, 2, 16]})
    res, report = deploy(sandbox, "t5", svc)
    assert res.returncode == 0, res.stdout
    doc = json.loads(h.path(DRAFT_CFG).read_text())
    assert doc["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 16]
    assert doc["architectures"] == ["LlamaForCausalLMEagle3"]  # other keys kept
    backups = h.run("sh", "-c", f"ls /var/lib/specops/releases/2*/previous{DRAFT_CFG}").stdout.split()
    assert len(backups) == 1 and h.path(backups[0]).read_text() == before
    assert model_info(h)["aux_hidden_state_capture"] == [0, 3, 17]  # -1 → the embedding output

    before = host_snapshot(h, DRAFT_CFG, f"{SITE}/srt/models/llama.py")
    res, report = deploy(sandbox, "t5", svc)
    assert res.returncode == 0 and report["changed"] == 0
    assert host_snapshot(h, DRAFT_CFG, f"{SITE}/srt/models/llama.py") == before


def test_draft_layer_ids_out_of_range_for_the_target(sandbox):
    h = sandbox.reset("t5")
    before = sha256_on(h, DRAFT_CFG)
    res, report = deploy(sandbox, "t5", sandbox_service(draft_config={IDS: [2, 16, 31]}))
    assert res.returncode == 1
    assert "ids [31] are never captured: the target has 32 layers" in report["error"]
    assert "another target" not in report["error"]  # the ids are the inventory's, not the draft's
    assert sha256_on(h, DRAFT_CFG) == before
    # The oracle: the simulator, like SGLang, cannot start with that config...
    h.path(DRAFT_CFG).write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 31]}}))
    sim = h.run("timeout", "20", f"{VENV}/bin/python", "-m", "sglang.launch_server", "--model-path",
                "/models/tiny-llama", "--port", "30099", "--speculative-algorithm", "EAGLE3",
                "--speculative-draft-model-path", "/models/tiny-llama-eagle3", "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", check=False)
    assert sim.returncode == 1 and "IndexError: aux hidden state layer 31 is out of range" in sim.stdout + sim.stderr
    # ... and the lint refuses it, in check mode too, before anything restarts.
    res, report = deploy(sandbox, "t5", sandbox_service(patches=[LLAMA]), "--check")
    assert res.returncode == 1 and report is not None, res.stdout
    assert "ids [31] are never captured: the target has 32 layers" in report["error"]
    assert (f"the draft /models/tiny-llama-eagle3 (its config.json: {DRAFT_CFG}) was made for another target"
            in report["error"])


def test_top_level_layer_ids_warn(sandbox):
    h = sandbox.reset("t5")
    h.path(DRAFT_CFG).write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"],
                                             "eagle_aux_hidden_state_layer_ids": [-1, 2, 16]}))
    res, _ = deploy(sandbox, "t5", sandbox_service())
    assert res.returncode == 0, res.stdout
    assert "WARNING: only a top-level eagle_aux_hidden_state_layer_ids [-1, 2, 16]; SGLang reads " \
           "eagle_config.eagle_aux_hidden_state_layer_ids and will ignore it" in res.stdout
    assert model_info(h)["aux_hidden_state_capture"] == [3, 17, 30]  # the default [2, L//2, L-3]


@pytest.mark.found("stale-start-stamps")  # a file touched 50 ms after the start is seen newer
def test_stale_process_is_reported_and_restarted(sandbox):
    h = sandbox.reset("t2")
    svc = sandbox_service(patches=[LLAMA])
    res, _ = deploy(sandbox, "t2", svc)
    assert res.returncode == 0
    started = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic")
    time.sleep(0.05)
    h.run("touch", f"{SITE}/{LLAMA}")  # the file changed after the process started
    inv = sandbox.inventory({"t2": {"services": [svc]}})
    verified = sandbox.inv("verify", "--host", "t2", inventory=inv)
    assert verified.returncode == 1 and "running old code" in verified.stdout
    status = sandbox.inv("status", "--host", "t2", inventory=inv)
    assert "STALE: running old code" in status.stdout
    res, report = deploy(sandbox, "t2", svc)
    assert res.returncode == 0, res.stdout
    assert any(c["target"] == "running code of sglang" and c["changed"] for c in report["changes"])
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") != started
