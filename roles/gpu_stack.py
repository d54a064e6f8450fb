"""The GPU Python stack: torch for the driver's CUDA, fla, sglang and the other pins.

By default the stack is an immutable venv of its own (specops/sglang/stack.py), built once
with uv beside the one that serves, and checked by importing in it; a deploy whose stack is
built makes no install call at all.  A host that sets `venv:` manages that venv itself: what
differs is installed there with pip, in place.  Packages come from the torch variant index
plus a package index, or, air-gapped, from a wheelhouse pushed over SSH (uv with them).
"""
from specops.inventory import schema
from pathlib import Path

from specops.ops import handlers
from specops import protocol
from specops.errors import UsageError
from specops.layout import UV_PIN
from specops.ops import Change, Op, PlanError, Venv
from specops.kinds import of_kind, venv_of
from specops.sglang import stack
from specops.sglang.indexes import REMOTE_WHEELHOUSE, pip_sources, uv_sources
from specops.layout import stack_disk_refusal
from specops.layout import venv_python
from specops.sglang.torchvariant import cuda_of, index_for, variant_for

NAME = "gpu_stack"
VARS = {**schema.STACK_VARS, **schema.INDEX_VARS}  # the host vars it reads
AFTER = ("models", "system_packages")  # the roles it runs after, when they run
REPROBE = True  # installing sglang decides where later roles' patches go
MODULES = {"torch": "torch", **dict(stack.PINNED)}  # a pinned distribution's host var is named as it imports
IMPORT_CHECK = """import json, importlib.metadata as md
out = {}
try:
    import torch
    out["torch"] = torch.__version__.split("+")[0]
    out["torch.version.cuda"] = torch.version.cuda
except ImportError as e:
    out["torch"] = "import failed: %s" % e
for dist, mod in PINNED:
    try:
        __import__(mod)
        out[dist] = md.version(dist)
    except Exception as e:
        out[dist] = "import failed: %s" % e
print(json.dumps(out))
""".replace("PINNED", repr(stack.PINNED))


class Wheelhouse(Op):
    """Air-gapped installs: the local wheelhouse on the host; only missing wheels are sent."""

    def __init__(self, local_dir):
        self.local = Path(local_dir).expanduser()
        if not self.local.is_dir():
            raise UsageError(f"wheelhouse {self.local} is not a directory")
        self.wheels = sorted(p for p in self.local.iterdir() if p.suffix == ".whl")

    def wants(self):
        return protocol.Probe(listdirs=[REMOTE_WHEELHOUSE])

    def plan(self, facts, ctx):
        have = facts.listing(REMOTE_WHEELHOUSE)
        missing = [w for w in self.wheels if have.get(w.name) != w.stat().st_size]
        if not missing:
            return self._change(f"wheelhouse {REMOTE_WHEELHOUSE}", "ok")
        size = sum(w.stat().st_size for w in missing)
        return Change(self.role, f"wheelhouse {REMOTE_WHEELHOUSE}", f"push {len(missing)} wheel(s), "
                      f"{size / 2**20:.1f} MiB", uploads=[(str(w), f"{REMOTE_WHEELHOUSE}/{w.name}") for w in missing])


def sglang_units(host) -> list[str]:
    return [s["name"] for s in of_kind(host, "sglang")]


class PythonPackages(Op):
    """torch (base version + CUDA), flash-linear-attention and sglang at their pins."""

    def __init__(self, host, venv):
        self.host, self.venv = host, venv
        self.torch, self.fla, self.sglang = host.get("torch"), host.get("fla"), host.get("sglang")

    def wants(self):
        return protocol.Probe(venvs=[self.venv], gpu=bool(self.torch), gpu_units=sglang_units(self.host))

    def plan(self, facts, ctx):
        v = facts.venv(self.venv)
        have = v.get("packages") or {}
        specs, expect, wrong = [], {}, []
        variant = None
        if self.torch:
            variant = variant_for(self.torch.get("cuda", "auto"), facts.gpu, self.host.name)
            version, cuda = self.torch["version"], cuda_of(variant)
            specs.append(f"torch=={version}+{variant}")
            expect.update({"torch": version, "torch.version.cuda": cuda})
            installed = have.get("torch")
            if not installed or installed.split("+")[0] != version or v.get("torch_cuda") != cuda:
                wrong.append(f"torch {installed or 'missing'} (cuda {v.get('torch_cuda')}) → {version}+{variant}")
        for dist, pin in (("flash-linear-attention", self.fla), ("sglang", self.sglang)):
            if pin:
                specs.append(f"{dist}=={pin['version']}")
                expect[dist] = pin["version"]
                if have.get(dist) != pin["version"]:
                    wrong.append(f"{dist} {have.get(dist) or 'missing'} → {pin['version']}")
        target = f"packages in {self.venv}" + (f" (torch {variant})" if variant else "")
        if not wrong:
            return self._change(target, "ok")
        python = venv_python(self.venv)
        return self._change(target, "; ".join(wrong), [
            protocol.PipInstall(python=python, specs=specs, sources=self.sources(variant),
                                desc=f"pip install {' '.join(specs)}"),
            protocol.Expect(python=python, code=IMPORT_CHECK, expect=expect,
                            what=f"after installing, the venv {self.venv} imports",
                            desc="import " + ", ".join(MODULES[d] for d in expect if d in MODULES)),
        ], notify=[handlers.restart(s["name"]) for s in of_kind(self.host, "sglang")])

    def sources(self, variant):
        return pip_sources(self.host, index_for(variant, (self.torch or {}).get("index_url")) if variant else None)


class Stack(Op):
    """The host's stack: its immutable venv, built with uv beside the one that serves."""

    def __init__(self, host):
        self.host, self.definition, self.path = host, stack.defines(host), venv_of(host)
        self.torch = host.get("torch")

    def wants(self):
        return protocol.Probe(venvs=[self.path], gpu=bool(self.torch), stacks=True,
                              units=sglang_units(self.host), gpu_units=sglang_units(self.host))

    def running(self, facts) -> dict | None:
        """The packages of the stack the host's SGLang units run now, when another one (else None)."""
        for s in of_kind(self.host, "sglang"):
            venv = stack.venv_in_unit(facts.unit(s["name"]).get("text"))
            if venv and venv != self.path:
                return next((st["packages"] for st in facts.stacks if st["path"] == venv), None) or \
                    facts.venv(venv).get("packages")
        return None

    def plan(self, facts, ctx):
        target = f"stack {self.path}"
        variant = variant_for(self.torch.get("cuda", "auto"), facts.gpu, self.host.name) if self.torch else None
        v = facts.venv(self.path)
        if v.get("exists") and any(s["path"] == self.path for s in facts.stacks):  # built whole
            if v.get("broken"):
                raise PlanError(f"stack {self.path} is broken: {v['broken']}; remove it to have it rebuilt")
            if self.torch and v.get("torch_cuda") != cuda_of(variant):
                raise PlanError(f"stack {self.path} has torch for CUDA {v.get('torch_cuda')}, but the driver now "
                                f"wants {variant}: set torch.cuda to the variant you want")
            return self._change(target, "ok")
        specs, expect = [], {}
        if self.torch:
            specs.append(f"torch=={self.torch['version']}+{variant}")
            expect.update({"torch": self.torch["version"], "torch.version.cuda": cuda_of(variant)})
        for dist, var in stack.PINNED:
            if self.host.get(var):
                specs.append(f"{dist}=={self.host[var]['version']}")
                expect[dist] = self.host[var]["version"]
        specs += self.definition["packages"]
        in_cache = any(s["packages"].get("torch") == expect.get("torch") and
                       s["packages"].get("torch.version.cuda") == expect.get("torch.version.cuda")
                       for s in facts.stacks)
        need, free = stack.need(self.host, in_cache), facts.data.get("stacks_free")
        if free is not None and free < need:
            raise PlanError(stack_disk_refusal(self.path.rsplit("/", 1)[1], need, free))
        first = index_for(variant, (self.torch or {}).get("index_url")) if variant else None
        facts.assume_venv(self.path, {"exists": True, "packages": {"sglang": expect.get("sglang")},
                                      "torch_cuda": expect.get("torch.version.cuda"), "planned": True})
        # what a person upgrades by ("sglang 0.5.23 → 0.5.24"), before the specs a new hash stands for
        moved = stack.versions(expect, self.running(facts), changed_only=True)
        return self._change(
            target,
            (f"{moved}; " if moved else "") + "build with uv: " + " ".join(specs),
            [
                protocol.BuildStack(
                    path=self.path,
                    python=self.definition["python"],
                    specs=specs,
                    sources=uv_sources(self.host, first),
                    uv_pip_args=pip_sources(self.host),
                    defines=self.definition,
                    need=need,
                    check=IMPORT_CHECK,
                    expect=expect,
                    desc=f"build stack {self.path} ({' '.join(specs)})",
                )
            ],
        )


def ops(host):
    wheelhouse = [Wheelhouse(host["wheelhouse"])] if host.get("wheelhouse") else []
    if stack.defines(host):
        if wheelhouse and not any(w.name.startswith(f"uv-{UV_PIN}-") for w in wheelhouse[0].wheels):
            raise UsageError(
                f"{host.name}: the wheelhouse {wheelhouse[0].local} has no uv {UV_PIN} wheel, which builds "
                f"the stack: add it (pip download uv=={UV_PIN}), or set venv: to manage the venv yourself"
            )
        return wheelhouse + [Stack(host)]
    venv = venv_of(host)
    out = [Venv(venv, host.get("python"))] + wheelhouse
    if host.get("torch") or host.get("fla") or host.get("sglang"):
        out.append(PythonPackages(host, venv))
    return out
