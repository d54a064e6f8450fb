"""The SGLang simulator as the sandbox ships it: its source tree, its releases on the package
index (each built as a wheel from the one tree, sglang_sim/versions/README.md), its dependencies,
and the stand-in box it expects (the tiny models' configs, the GPUs the nvidia-smi stand-in
reports, the venv it is installed in).  provision.py builds hosts with it and pkgindex.py serves
its wheels; both import it, and it imports neither.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from sandbox import base, fleet, wheels

HERE = Path(__file__).resolve().parent
SIM_SRC = HERE / "sglang_sim"
VENV = "/opt/sglang/venv"
SIM_VERSION = "0.5.23"  # the one the gpubox layer pre-installs
# The releases the package index offers, oldest first: one tree, and each release's own files
# laid over it from sglang_sim/versions/<version>/, every earlier release's first, as a release
# keeps what the one before it changed (that directory's README says how they differ).
# SIM_FAILING's server fails at start, whatever its flags.
SIM_VERSIONS = ("0.5.23", "0.5.24", "0.5.25", "0.5.26")
SIM_FAILING = "0.5.25"  # fails at start; the releases after it do not carry its failure
# Releases that carry real SGLang files beside the simulator's own modules (which their server does
# not import while it serves a llama): what a patch cut from a real release is applied to on a host.
SIM_REAL_FILES = {"0.5.26": ("0.5.23", ["srt/models/deepseek_v2.py"])}  # release: (real release, files)

MODELS = {
    "tiny-llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "num_hidden_layers": 32, "hidden_size": 4096, "max_position_embeddings": 8192},
    "tiny-llama-eagle3": {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                          "num_hidden_layers": 1, "hidden_size": 4096,
                          "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}},
    "tiny-qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                   "num_hidden_layers": 28, "max_position_embeddings": 32768},
    "tiny-deepseek": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                      "num_hidden_layers": 61, "max_position_embeddings": 163840},
    "tiny-deepseek-eagle3": {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                             "num_hidden_layers": 1,
                             "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}},
}
GPUS = {"driver_version": "575.57.08",
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total": 81559} for _ in range(4)]}


def _tree_hash(*paths: Path) -> str:
    h = hashlib.sha256()
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and ".egg-info" not in str(p)) if root.is_dir() else [root]
        for p in files:
            h.update(str(p.relative_to(root.parent)).encode())
            h.update(p.read_bytes())
    h.update(json.dumps([MODELS, GPUS, VENV]).encode())
    return h.hexdigest()[:10]


# What the simulator needs besides the standard library, as real SGLang does: setproctitle,
# which retitles its children (sglang::scheduler_TP0 ...).  Binary wheels, for CPython 3.11
# (the hosts' python3) and PyPy 3.9 (the "pypy" layer).
SIM_REQUIRES = ["setproctitle==1.3.6", "tqdm==4.70.1"]  # tqdm: the version the real 0.5.23 install has
SIM_DEP_TARGETS = [("3.11", "cp", "cp311"), ("3.9", "pp", "pypy39_pp73")]


@base.built_once
def sim_deps() -> Path:
    """The simulator's dependencies as wheels, downloaded once from PyPI and cached."""
    key = hashlib.sha256(json.dumps([SIM_REQUIRES, SIM_DEP_TARGETS]).encode()).hexdigest()[:10]
    path = base.CACHE / f"wheels-sim-deps-{key}"
    if (path / ".complete").exists():
        return path
    tmp = Path(str(path) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for version, impl, abi in SIM_DEP_TARGETS:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary", ":all:", "--python-version", version, "--implementation", impl,
                        "--abi", abi, "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                        "--platform", "manylinux_2_28_x86_64", "-d", str(tmp), *SIM_REQUIRES], check=True)
    (tmp / ".complete").write_text("")
    tmp.rename(path)
    return path


def sim_wheel(dest: Path, version: str = SIM_VERSION) -> Path:
    """The simulator as the wheel sglang-<version>-py3-none-any.whl, with its dependencies beside
    it: the tree with the overlays up to that release's (never the failing one's but its own), the
    real SGLang files SIM_REAL_FILES gives it, and a version.py that says that release (the tree's
    own says 0.5.23, for running it from source)."""
    if version not in SIM_VERSIONS:
        raise ValueError(f"no simulator release {version!r}: one of {', '.join(SIM_VERSIONS)}")
    for dep in sim_deps().glob("*.whl"):
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(dep, dest / dep.name)
    overlays = [SIM_SRC / "versions" / v for v in SIM_VERSIONS[:SIM_VERSIONS.index(version) + 1]
                if v != SIM_FAILING or v == version]
    generated = {"sglang/version.py": f'__version__ = "{version}"\n'.encode()}
    if version in SIM_REAL_FILES:
        from sandbox import real_sglang
        real, files = SIM_REAL_FILES[version]
        generated.update({f"sglang/{rel}": real_sglang.file_of(real, rel).encode() for rel in files})
    return wheels.from_tree(dest, "sglang", version, SIM_SRC, "sglang", overlays=overlays, generated=generated,
                            requires=SIM_REQUIRES, summary="specops sandbox stand-in for SGLang")
