"""The real SGLang 0.5.23, installed on the controller as the oracle for the static rules.

Only its argument resolver runs (on CPU, `--device cpu`): no model, no GPU.  The venv is
built once and cached like the fleet's root filesystem (a few minutes, mostly pip).
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

from sandbox import base, fleet

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
STUBS = HERE.parent.parent / "tests" / "support" / "oracle_stubs"
PINS = ["torch==2.13.0", "sglang==0.5.23"]


@base.built_once
def venv() -> Path:
    """The cached venv's python, built on first use."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + " ".join(PINS).encode()).hexdigest()[:10]
    root = base.CACHE / f"real-sglang-{key}"
    python = root / "bin" / "python"
    if (root / ".complete").exists():
        return python
    tmp = Path(str(root) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base.log(f"installing the real sglang 0.5.23 resolver into {root} (a few minutes, cached)")
    t0 = time.monotonic()
    subprocess.run(["python3", "-m", "venv", str(tmp)], check=True)
    pip = [str(tmp / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + [PINS[0]], check=True)
    subprocess.run(pip + ["--no-deps", PINS[1]], check=True)
    subprocess.run(pip + ["-r", str(REQUIREMENTS)], check=True)
    (tmp / ".complete").write_text("")
    # A venv's scripts name their own path, so it is built in place under a temporary
    # name only for the directory; the interpreter itself resolves relative to pyvenv.cfg.
    tmp.rename(root)
    base.log(f"real sglang ready in {time.monotonic() - t0:.0f}s")
    return python


def resolve(argvs: list[list[str]]) -> list[dict]:
    """Run specops's resolver program in the real SGLang for every argv, in one process."""
    import json
    import os
    program = HERE.parent.parent / "specops" / "sglang" / "resolver.py"
    res = subprocess.run([str(venv()), str(program)], input=json.dumps(argvs), capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(STUBS)}, timeout=900)
    if res.returncode != 0:
        raise RuntimeError(f"real sglang resolver failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout)


WHEELS = ("0.5.21", "0.5.23")  # real releases whose files the patch tests read (never installed)


@base.built_once
def wheels() -> Path:
    """The real sglang wheels of WHEELS (27-39 MB each, no dependencies), downloaded once and
    cached: read by the tests of anything that reads SGLang's own files (patches, rebases)."""
    root = base.CACHE / ("wheels-sglang-real-" + "-".join(WHEELS))
    if (root / ".complete").exists():
        return root
    tmp = Path(str(root) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base.log(f"downloading the real sglang {', '.join(WHEELS)} wheels (read only; cached afterwards)")
    for v in WHEELS:  # one at a time: pip refuses two versions of one project in one call
        subprocess.run(["python3", "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary", ":all:", "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
                        "-d", str(tmp), f"sglang=={v}"], check=True)
    (tmp / ".complete").write_text("")
    tmp.rename(root)
    return root


def wheel(version: str) -> Path:
    return next(wheels().glob(f"sglang-{version}-*.whl"))


def file_of(version: str, inner: str) -> str:
    """A file of a real release, e.g. file_of("0.5.21", "srt/models/deepseek_v2.py")."""
    import zipfile
    with zipfile.ZipFile(wheel(version)) as z:
        return z.read(f"sglang/{inner}").decode()
