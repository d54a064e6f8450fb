"""Stand-in CUDA torch wheels: the interface specops and SGLang touch, without the 2 GB.

torch.__version__ carries the variant label (2.9.1+cu128), torch.version.cuda is that
variant's CUDA (None for +cpu), and torch.cuda.is_available() asks nvidia-smi, as the
real one asks the driver: True only for a CUDA build on a driver new enough for it.
"""
from __future__ import annotations

from pathlib import Path

from sandbox import wheels
from specops.sglang.torchvariant import TABLE, cuda_of

INIT = '''"""specops sandbox stand-in for torch {version}."""
from torch import cuda, version  # noqa: F401

__version__ = version.__version__
'''
VERSION = '''from typing import Optional

__version__ = "{version}"
cuda: Optional[str] = {cuda!r}
git_version = "specops-standin"
'''
CUDA = '''import shutil
import subprocess

from torch import version

MIN_DRIVER = {min_driver!r}  # CUDA version -> oldest driver that runs it


def _driver():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None, 0
    res = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True)
    lines = res.stdout.split()
    return (int(lines[0].split(".")[0]) if res.returncode == 0 and lines else None), len(lines)


def is_available():
    if version.cuda is None:
        return False
    driver, _ = _driver()
    return driver is not None and driver >= MIN_DRIVER.get(version.cuda, 10**6)


def device_count():
    return _driver()[1] if is_available() else 0
'''


def build(dest: Path, version: str, variant: str) -> Path:
    full = f"{version}+{variant}"
    cuda = cuda_of(variant)
    min_driver = {row["cuda"]: row["min_driver"] for row in TABLE}
    files = {"torch/__init__.py": INIT.format(version=full).encode(),
             "torch/version.py": VERSION.format(version=full, cuda=cuda).encode(),
             "torch/cuda/__init__.py": CUDA.format(min_driver=min_driver).encode()}
    return wheels.build(dest, "torch", full, files, summary=f"specops stand-in for torch {full}")
