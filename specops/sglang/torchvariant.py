"""Which torch build a host gets: the CUDA variant from the driver (a data table), its index, and
whether the driver runs the variant asked for."""
from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import SpecopsError

# libyaml's parser where PyYAML has one: the same table in ~0.3 ms, not ~2 ms of every task's start
_DATA = yaml.load((Path(__file__).parent / "cuda_variants.yml").read_text(),
                  Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
TABLE = _DATA["auto"]
RUNS_ON = {int(major): driver for major, driver in _DATA["runs_on"].items()}  # CUDA major → oldest driver major
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


def driver_refusal(variant: str, gpu: dict, host: str) -> str | None:
    """Why the host's driver cannot run torch `variant` (None: it can, or the facts do not say)."""
    cuda = cuda_of(variant)
    driver = str(gpu.get("driver") or "")
    if cuda is None or not gpu.get("present") or gpu.get("error") or not driver.split(".")[0].isdigit():
        return None
    floor, have = RUNS_ON.get(int(cuda.split(".")[0])), int(driver.split(".")[0])
    if floor is None or have >= floor:
        return None
    auto = next((row["variant"] for row in TABLE if have >= row["min_driver"]), None)
    runs = max((m for m, d in RUNS_ON.items() if have >= d), default=None)
    fix = (f"set torch.cuda: auto ({auto} here)" if auto else
           f"set torch.cuda to a CUDA {runs}.x variant" if runs else f"upgrade the NVIDIA driver to {floor} or newer")
    return (f"torch {variant} (CUDA {cuda}) needs an NVIDIA driver {floor} or newer; {host} has {driver} "
            f"(nvidia-smi): {fix}" + (f", or upgrade the driver to {floor} or newer" if auto or runs else ""))


def index_for(variant: str, template: str | None) -> str:
    return (template or DEFAULT_INDEX).format(variant=variant)
