"""What an SGLang service takes of one node's GPUs: how many (its ranks there), and how much of
each its share of the weights leaves.  roles/gpu_fit.py holds these against the host's facts
before anything moves.

Placement is SGLang 0.5.23's (srt/entrypoints/engine.py `_calculate_rank_ranges`,
srt/managers/data_parallel_controller.py `launch_tensor_parallel_group`): the nodes split pp
first, then tp; a rank's GPU is base_gpu_id + its replica's offset + (pp rank on the node) × (tp
per node) + (tp rank on the node) × gpu_id_step, and each dp replica (without DP attention)
starts tp × pp × gpu_id_step further on.  `--enable-dp-attention` makes dp groups inside tp
(0.5.23 reads it as --attn-dp-size): they take no GPUs of their own.
"""
from __future__ import annotations

from dataclasses import dataclass

# A setting's flags, as SGLang's parser takes them; extra_args come after the service's own
# flags, so an extra_arg wins (argparse keeps the last).
FLAGS = {"tp": ("--tp-size", "--tensor-parallel-size"), "dp": ("--dp-size", "--data-parallel-size"),
         "pp": ("--pp-size", "--pipeline-parallel-size"), "base": ("--base-gpu-id",), "step": ("--gpu-id-step",)}
DP_ATTENTION = "--enable-dp-attention"
# What SGLang keeps of each GPU for activations and graphs, at the least, when mem_fraction_static
# is not given (srt/arg_groups/memory_hook.py: 1536 MiB plus tp × pp / 8 GiB, its leanest sizing).
RESERVE_FLOOR_MIB = 1536
# Flags under which the bytes on disk are not the bytes on the GPUs (quantized or cast on load,
# offloaded to the CPU, another loader): no memory check then.
RESHAPES_WEIGHTS = ("--quantization", "--dtype", "--load-format", "--cpu-offload-gb", "--torchao-config",
                    "--modelopt-quant", "--offload-")


def _flag(args: list[str], names: tuple) -> str | None:
    value = None
    for i, a in enumerate(args):
        if a in names and i + 1 < len(args):
            value = args[i + 1]
        elif a.split("=", 1)[0] in names and "=" in a:
            value = a.split("=", 1)[1]
    return value


@dataclass
class Placement:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    replicas: int = 1   # dp, unless DP attention puts dp inside tp
    nnodes: int = 1
    base: int = 0
    step: int = 1

    def per_node(self) -> int:
        """The GPUs it takes on each node: its highest GPU index there, plus one."""
        pp_node = max(self.pp // self.nnodes, 1)
        tp_node = max(self.tp // max(self.nnodes // self.pp, 1), 1)
        last = ((self.replicas - 1) * self.tp * self.pp * self.step + (pp_node - 1) * tp_node
                + (tp_node - 1) * self.step)
        return self.base + last + 1

    def only_tp(self) -> bool:
        return (self.pp, self.replicas, self.base, self.step) == (1, 1, 0, 1)

    def what(self) -> str:
        """How the inventory asks for it: "tp 4 × dp 2 across 2 nodes"."""
        parts = [f"tp {self.tp}"] + [f"{k} {getattr(self, k)}" for k in ("pp", "dp") if getattr(self, k) > 1]
        out = " × ".join(parts) + (f" across {self.nnodes} nodes" if self.nnodes > 1 else "")
        return out + (f" from GPU {self.base} (--base-gpu-id)" if self.base else "")

    def shards(self) -> int:
        """How many GPUs share one copy of the weights."""
        return self.tp * self.pp


def of(svc: dict) -> Placement | None:
    """The service's placement (None: it does not run on CUDA GPUs, or its flags are not numbers)."""
    if (svc.get("device") or "cuda") != "cuda":
        return None
    args = [str(a) for a in svc.get("extra_args") or []]
    given = {"tp": svc.get("tp"), "dp": svc.get("dp")}
    for key, names in FLAGS.items():
        given[key] = _flag(args, names) or given.get(key)
    try:
        p = Placement(**{k: int(v) for k, v in given.items() if v is not None}, nnodes=int(svc.get("nnodes") or 1))
    except ValueError:
        return None  # SGLang's own parser says so, at the preflight
    if min(p.tp, p.pp, p.dp, p.nnodes, p.step) < 1 or p.base < 0:
        return None
    p.replicas = 1 if DP_ATTENTION in args else p.dp
    return p


def visible_devices(svc: dict) -> str | None:
    """CUDA_VISIBLE_DEVICES as the unit sets it (cuda_visible_devices wins over env's)."""
    cvd = svc.get("cuda_visible_devices") or (svc.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    return None if cvd is None else str(cvd)


def devices(svc: dict, count: int) -> list[int] | None:
    """The node's GPUs (of `count`) CUDA shows the service, in CUDA's order (None: named by UUID
    or MIG device, not counted here).  CUDA stops at the first index that does not exist."""
    cvd = visible_devices(svc)
    if cvd is None:
        return list(range(count))
    out = []
    for entry in cvd.split(","):
        if not entry.strip().isdigit():
            return None
        if int(entry) >= count:
            break
        out.append(int(entry))
    return out


def reserve_mib(svc: dict, p: Placement, total_mib: float) -> float:
    """What SGLang keeps of each GPU beyond the weights and the KV cache, at the least."""
    if svc.get("mem_fraction_static") is not None:
        return total_mib * (1 - float(svc["mem_fraction_static"]))
    return RESERVE_FLOOR_MIB + p.tp * p.pp / 8 * 1024


def reshapes_weights(svc: dict) -> bool:
    return any(str(a).startswith(RESHAPES_WEIGHTS) for a in svc.get("extra_args") or [])


def weight_bytes(files: dict[str, int]) -> int | None:
    """The bytes SGLang's default loader reads of a checkpoint, from its directory's top-level files
    (name → size): the *.safetensors when there are any, else the *.bin (srt/model_loader/loader.py's
    patterns, in its order).  A consolidated.safetensors beside sharded ones is another copy (Mistral
    repositories ship both; the index names the shards).  None: no weight files there."""
    top = {n: s for n, s in files.items() if "/" not in n}
    chosen = [n for n in top if n.endswith(".safetensors")]
    if any(not n.startswith("consolidated") for n in chosen):
        chosen = [n for n in chosen if not n.startswith("consolidated")]
    chosen = chosen or [n for n in top if n.endswith(".bin") and n != "training_args.bin"]
    return sum(top[n] for n in chosen) if chosen else None
