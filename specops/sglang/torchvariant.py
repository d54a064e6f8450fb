"""Which torch build a host gets: the CUDA variant from the driver (a data table), its index."""
from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import SpecopsError

TABLE = yaml.safe_load((Path(__file__).parent / "cuda_variants.yml").read_text())
DEFAULT_INDEX = "https://download.pytorch.org/whl/{variant}"


def cuda_of(variant: str) -> str | None:
    """torch.version.cuda for a variant: cu128 → 12.8, cpu → None."""
    if variant == "cpu":
        return None
    for row in TABLE:
        if row["variant"] == variant:
            return row["cuda"]
    digits = variant.removeprefix("cu")
    if not digits.isdigit() or len(digits) < 3:
        raise SpecopsError(f"unknown torch variant {variant!r}: use cpu or cuXYZ (e.g. cu128)")
    return f"{digits[:-1]}.{digits[-1]}"


def variant_for(wanted: str, gpu: dict, host: str) -> str:
    """The variant to install: `wanted` itself, or with 'auto' the table's pick for the driver."""
    if wanted != "auto":
        cuda_of(wanted)  # validates
        return wanted
    if not gpu.get("present"):
        raise SpecopsError(f"{host}: torch cuda is auto, but the host has no nvidia-smi, so there is no "
                           f"driver to choose a CUDA variant from; set torch.cuda (e.g. cu128 or cpu)")
    if gpu.get("error") or not gpu.get("driver"):
        raise SpecopsError(f"{host}: torch cuda is auto, but nvidia-smi failed: {gpu.get('error', 'no GPUs')}")
    major = int(str(gpu["driver"]).split(".")[0])
    for row in TABLE:
        if major >= row["min_driver"]:
            return row["variant"]
    raise SpecopsError(f"{host}: NVIDIA driver {gpu['driver']} is older than every CUDA variant "
                       f"specops knows (the oldest needs {TABLE[-1]['min_driver']})")


def index_for(variant: str, template: str | None) -> str:
    return (template or DEFAULT_INDEX).format(variant=variant)
