"""The simulator's releases (sandbox/provision.py SIM_VERSIONS, sandbox/sglang_sim/versions): each
wheel says its version; 0.5.24's model files moved as a real release's do, so a patch cut against
0.5.23 applies only at an offset; 0.5.25 fails at start with a traceback.  No fleet: the wheels are
built into tmp_path and the server runs here, from an unpacked wheel."""
import base64
import difflib
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from sandbox import provision, simulator

MODEL_CODE = 'MODEL_CODE = "upstream"'
MODELS = ("srt/models/llama.py", "srt/models/deepseek_v2.py")


def build(dest, version):
    """simulator.sim_wheel without the dependency wheels it copies beside (those come from PyPI)."""
    real_deps = simulator.sim_deps
    simulator.sim_deps = lambda: dest / "no-deps"
    try:
        return simulator.sim_wheel(dest, version)
    finally:
        simulator.sim_deps = real_deps


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    dest = tmp_path_factory.mktemp("wheels")
    return {v: build(dest, v) for v in provision.SIM_VERSIONS}


def read(wheel, path):
    with zipfile.ZipFile(wheel) as z:
        return z.read(path).decode()


def test_each_release_is_a_wheel_that_says_its_version(wheels):
    assert provision.SIM_VERSION == "0.5.23" and provision.SIM_FAILING in provision.SIM_VERSIONS
    for version, wheel in wheels.items():
        assert wheel.name == f"sglang-{version}-py3-none-any.whl"
        meta = read(wheel, f"sglang-{version}.dist-info/METADATA").splitlines()
        assert "Name: sglang" in meta and f"Version: {version}" in meta
        assert read(wheel, "sglang/version.py") == f'__version__ = "{version}"\n'
    with pytest.raises(ValueError, match="no simulator release"):
        build(Path("/nonexistent"), "0.5.99")


def test_0_5_23_is_the_tree_as_it_is_and_no_release_ships_the_overlays(wheels):
    """The gpubox layer's 0.5.23 is the tree, file for file; the overlays are no part of the package."""
    tree = provision.SIM_SRC / "sglang"
    files = {p.relative_to(provision.SIM_SRC).as_posix(): p.read_text()
             for p in tree.rglob("*.py") if "__pycache__" not in p.parts}
    with zipfile.ZipFile(wheels["0.5.23"]) as z:
        shipped = {n: z.read(n).decode() for n in z.namelist() if not n.startswith("sglang-")}
    assert shipped == files
    overlays = provision.SIM_SRC / "versions"
    assert not overlays.is_relative_to(tree) and list(overlays.rglob("*.py"))
    for wheel in wheels.values():
        assert not [n for n in zipfile.ZipFile(wheel).namelist() if "versions" in n]


def test_0_5_24_model_files_differ_keep_model_code_one_line_and_say_their_release(wheels):
    for rel in MODELS:
        old, new = read(wheels["0.5.23"], f"sglang/{rel}"), read(wheels["0.5.24"], f"sglang/{rel}")
        assert old != new, rel
        for text, version in ((old, "0.5.23"), (new, "0.5.24")):
            lines = text.splitlines()
            assert lines.count(MODEL_CODE) == 1 and len([x for x in lines if "MODEL_CODE =" in x]) == 1, rel
            assert f'FILE_VERSION = "{version}"' in lines, rel
        # 0.5.25 keeps what 0.5.24 changed
        assert read(wheels["0.5.25"], f"sglang/{rel}") == new
    # the 0.5.23 files are as long as the whole-file patches (the stale-bytecode trap needs it)
    patches = Path(__file__).resolve().parent.parent / "files" / "patches"
    for rel in MODELS:
        assert len(read(wheels["0.5.23"], f"sglang/{rel}").encode()) == (patches / rel).stat().st_size


def hunks(old, new):
    """(old start line, the old side's lines: context and removed) of each hunk of a 3-line diff."""
    out = []
    for line in difflib.unified_diff(old, new, n=3, lineterm=""):
        if line.startswith("@@"):
            start = int(line.split()[1][1:].split(",")[0])
            out.append((start, []))
        elif out and line[:1] in (" ", "-"):
            out[-1][1].append(line[1:])
    return out


def found_at(lines, block):
    """Where block's lines stand consecutively in lines (1-based), every place."""
    return [i + 1 for i in range(len(lines) - len(block) + 1) if lines[i:i + len(block)] == block]


@pytest.mark.parametrize("rel", MODELS)
def test_a_diff_of_the_model_code_line_applies_to_0_5_24_only_at_an_offset(wheels, rel):
    old = read(wheels["0.5.23"], f"sglang/{rel}").splitlines()
    new = read(wheels["0.5.24"], f"sglang/{rel}").splitlines()
    patched = [('MODEL_CODE = "patched"' if x == MODEL_CODE else x) for x in old]
    [(start, block)] = hunks(old, patched)
    assert MODEL_CODE in block and len(block) == 7  # 3 lines of context either side
    assert found_at(old, block) == [start]
    # Not verbatim: the lines at the same numbers in 0.5.24 are others (the line moved)...
    assert new[start - 1:start - 1 + len(block)] != block
    # ...but the hunk's lines are all there, one after the other, further down: it applies at an offset.
    [at] = found_at(new, block)
    assert at > start
    # A diff that also changes the line 0.5.24 changed (ENTRY_CLASSES) finds its lines nowhere there.
    touched = [('ENTRY_CLASSES = "X"' if x.startswith("ENTRY_CLASSES") else x) for x in patched]
    assert [found_at(new, b) for _, b in hunks(old, touched)] == [[]]


def test_every_wheel_records_each_file_with_its_sha256_and_builds_the_same_bytes_again(wheels, tmp_path):
    for version, wheel in wheels.items():
        with zipfile.ZipFile(wheel) as z:
            record = z.read(f"sglang-{version}.dist-info/RECORD").decode().splitlines()
            names = set(z.namelist())
            rows = [r.split(",") for r in record]
            assert {r[0] for r in rows} == names
            for path, digest, size in rows:
                if path.endswith("/RECORD"):
                    assert digest == size == ""
                    continue
                data = z.read(path)
                assert digest == "sha256=" + base64.urlsafe_b64encode(
                    hashlib.sha256(data).digest()).rstrip(b"=").decode() and int(size) == len(data), path
    assert build(tmp_path, "0.5.24").read_bytes() == wheels["0.5.24"].read_bytes()


def unpack(wheel, root):
    """The wheel's files, importable from root; setproctitle (a binary wheel from PyPI on the hosts)
    as a stub: only the scheduler children the tests do not start would call it."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root)
    (root / "setproctitle.py").write_text("def setproctitle(title):\n    pass\n")
    return root


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def models(root):
    for name, cfg in (("target", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32}),
                      ("draft", {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
                                 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}})):
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text(json.dumps(cfg))
    return root / "target", root / "draft"


def server_env(site, tmp_path, **extra):
    # SGLANG_SIM_GPU_REGISTRY: not this machine's /run; STARTUP_DELAY 0: ready once bound
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(site),
            "SGLANG_SIM_GPU_REGISTRY": str(tmp_path / "gpu"), "SGLANG_SIM_STARTUP_DELAY": "0", **extra}


def test_a_0_5_24_server_reports_its_version_and_its_model_files_release(wheels, tmp_path):
    """The control for the failure below: the same harness starts a release that works."""
    site = unpack(wheels["0.5.24"], tmp_path / "site")
    target, _ = models(tmp_path / "models")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", str(target),
                             "--port", str(port)], cwd=tmp_path, env=server_env(site, tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, info = time.monotonic() + 60, None  # bounds a broken test; a loaded box is slow
        while info is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=1) as r:
                    info = json.load(r)
            except OSError:
                time.sleep(0.1)
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert info is not None, err
    assert (info["version"], info["model_code"], info["model_code_version"]) == ("0.5.24", "upstream", "0.5.24")
    assert info["model_code_file"] == str(site / "sglang/srt/models/llama.py")


@pytest.mark.parametrize("flags,env", [
    ([], {}),
    (["--tp-size", "2", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
      "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"], {"SGLANG_SIM_SHARDS": "3"}),
], ids=["plain", "eagle3-tp2-chatty-load"])
def test_0_5_25_exits_non_zero_with_a_traceback_by_itself(wheels, tmp_path, flags, env):
    site = unpack(wheels[provision.SIM_FAILING], tmp_path / "site")
    target, draft = models(tmp_path / "models")
    if "EAGLE3" in flags:
        flags = [*flags, "--speculative-draft-model-path", str(draft)]
    res = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(target),
                          "--port", str(free_port()), *flags], cwd=tmp_path, env=server_env(site, tmp_path, **env),
                         capture_output=True, text=True, timeout=90)  # it ends by itself (a hang times out)
    lines = res.stderr.splitlines()
    assert res.returncode != 0, res.stderr
    # its usual early lines, then the load begins, then the traceback, ending with the error
    assert "Loaded model code sglang.srt.models.llama" in res.stderr and "server_args=" in res.stderr
    begin = next(i for i, x in enumerate(lines) if "Load weight begin" in x)
    trace = lines.index("Traceback (most recent call last):")
    assert begin < trace and lines[-1].startswith("ImportError: ") and "undefined symbol" in lines[-1], res.stderr
    assert "fired up" not in res.stderr
