"""Before anything moves: what the host's GPUs, as the probe found them, already refuse.

A service whose ranks need more GPUs than the node has (tp × pp × dp, per node for a service
across nodes: specops/sglang/placement.py), whose share of the weights does not fit each GPU (where
the facts know both the weights on the host and the GPUs' memory), or a torch.cuda variant the
driver cannot run, would pass every other check and fail only when the server starts.  The
facts are the one probe's (nvidia-smi's GPUs and driver, the weights' directory listing or
manifest), so this costs no round trip; it runs first, so a refusal comes before a byte is
pushed, in --check too.  What the facts do not say (no nvidia-smi, memory it cannot report, a
checkpoint not on the host yet) is not refused here."""
from specops import protocol
from specops.inventory import schema
from specops.ops import JsonKeys, Op, PlanError
from specops.kinds import of_kind
from specops.kinds.sglang import weight_sources
from specops.sglang import placement
from specops.sglang.drafts import config_of
from specops.sglang.torchvariant import driver_refusal

NAME = "gpu_fit"
VARS = {"torch": schema.STACK_VARS["torch"]}  # the host vars it reads (and services)
AFTER = ()  # the first role: nothing has moved when it refuses
MiB, GiB = 2**20, 2**30
IDENTITY = ("source", "repo", "revision", "host", "path")  # what names a weights source's content


class DriverFit(Op):
    """The torch variant the inventory names runs on the host's driver (auto picks one that does)."""

    def __init__(self, host):
        self.host, self.variant = host, host["torch"]["cuda"]

    def wants(self):
        return protocol.Probe(gpu=True, gpu_units=[s["name"] for s in of_kind(self.host, "sglang")])

    def plan(self, facts, ctx):
        why = driver_refusal(self.variant, facts.gpu, self.host.name)
        if why:
            raise PlanError(why)
        return self._change(f"NVIDIA driver for torch {self.variant}", "ok")


class GpusFit(Op):
    """One SGLang service against this node's GPUs: enough of them, and room on each for its
    share of the weights."""

    def __init__(self, host, svc):
        self.host, self.svc, self.services = host, svc, (svc["name"],)
        self.weights = [(setting, path.rstrip("/"), source) for setting, path, source in weight_sources(svc)]

    def wants(self):
        configs = [config_of(p) for _, p, _ in self.weights]
        return protocol.Probe(gpu=True, gpu_units=list(self.services), units=list(self.services),
                              weights=[p for _, p, source in self.weights if source],
                              weight_dirs=[p for _, p, source in self.weights if not source],
                              files=configs, content={c: "always" for c in configs})

    def plan(self, facts, ctx):
        gpu, p = facts.gpu, placement.of(self.svc)
        gpus = gpu.get("gpus") or []
        totals = [g.get("memory.total") for g in gpus]
        # No nvidia-smi, or one that failed, says nothing; neither does one that cannot report
        # memory (MIG devices, which CUDA counts apart from the GPUs nvidia-smi lists).
        if p is not None and gpu.get("present") and not gpu.get("error") and None not in totals:
            shown = placement.devices(self.svc, len(gpus))
            if shown is not None:
                self.count(p, shown, len(gpus))
                self.memory(p, facts, min(totals[i] for i in shown[p.base:p.per_node()]))
        return self._change(f"GPUs for {self.svc['name']}", "ok")

    def count(self, p, shown, have):
        need, name, cvd = p.per_node(), self.svc["name"], placement.visible_devices(self.svc)
        if need <= len(shown):
            return
        where = (f"{self.host.name} shows it {len(shown)} (cuda_visible_devices {cvd}; nvidia-smi lists {have})"
                 if cvd is not None else f"{self.host.name} has {have} (nvidia-smi)")
        fix = ("name GPUs that exist in cuda_visible_devices" if not shown and cvd is not None else
               "run it on a host whose driver shows its GPUs" if not shown else
               f"set tp: {len(shown) * p.nnodes} or fewer" if p.only_tp() else
               f"make {p.what()} fit {len(shown)} GPU{'s' * (len(shown) != 1)}")
        raise PlanError(f"{name}: {p.what()} needs {need} GPU{'s' * (need != 1)}"
                        f"{' on each node' if p.nnodes > 1 else ''}; {where}: {fix}")

    def memory(self, p, facts, gpu_mib):
        if placement.reshapes_weights(self.svc) or not gpu_mib:
            return
        sizes = [(setting, path, self.on_host(facts, path, source)) for setting, path, source in self.weights]
        if sizes[0][2] is None:
            return  # the target's weights are not on the host yet: nothing to hold them to
        total = sum((size or 0) * loaded_share(facts, path) for _, path, size in sizes)
        share_mib = total / MiB / p.shards()
        room_mib = gpu_mib - placement.reserve_mib(self.svc, p, gpu_mib)
        if share_mib <= room_mib:
            return
        disk = " + ".join(f"{'draft ' if setting != 'model_path' else ''}{path} {size / GiB:.1f} GiB"
                          + (" (float32: half of it as 16-bit)" if loaded_share(facts, path) < 1 else "")
                          for setting, path, size in sizes if size)
        kept = (f"mem_fraction_static {self.svc['mem_fraction_static']} leaves {room_mib / 1024:.1f} GiB of each for "
                f"weights and cache" if self.svc.get("mem_fraction_static") is not None else
                f"SGLang keeps at least {(gpu_mib - room_mib) / 1024:.1f} GiB of each for activations")
        raise PlanError(f"{self.svc['name']}: its weights need {share_mib / 1024:.1f} GiB on each GPU ({disk} on disk, "
                        f"over {p.what()}); {self.host.name}'s GPUs have {gpu_mib / 1024:.1f} GiB (nvidia-smi), and "
                        f"{kept}: use more GPUs (tp), or a smaller or quantized checkpoint")

    @staticmethod
    def on_host(facts, path, source):
        """The bytes of the weights at `path` as they are on the host (None: not known).  Weights
        with a source count only when the manifest says they are that source's: a source that
        changed will replace them."""
        if not source:  # listed with lstat: an HF cache's links count as links (less: never a refusal)
            return placement.weight_bytes(facts.weight_listing(path))
        have = (facts.data.get("weights") or {}).get(path) or {}
        made = ((have.get("manifest") or {}).get("source")) or {}
        if not made or have.get("differ") or any(made.get(k) != source.get(k) for k in IDENTITY):
            return None
        return placement.weight_bytes(have.get("present") or {})


def loaded_share(facts, path) -> float:
    """What share of a checkpoint's bytes on disk its weights take on the GPU under SGLang's
    default dtype (auto: srt/configs/model_config.py _get_and_verify_dtype): float32, or a
    config that names no dtype (taken as float32), is cast to 16 bits.  Unknown: half, so a
    checkpoint is never refused for bytes SGLang would not load."""
    try:
        doc = JsonKeys(config_of(path), {}).current(facts)
    except (PlanError, KeyError, ValueError, TypeError):
        return 0.5
    dtype = doc.get("dtype") or doc.get("torch_dtype")
    return 1.0 if isinstance(dtype, str) and dtype != "float32" else 0.5


def ops(host):
    torch = host.get("torch") or {}
    # auto follows the driver (gpu_stack says when no variant fits it); cpu needs none
    out = [DriverFit(host)] if torch.get("cuda", "auto") not in ("auto", "cpu") else []
    return out + [GpusFit(host, svc) for svc in of_kind(host, "sglang")]
