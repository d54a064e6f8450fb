"""The router's own venv with sglang-router at its pin (one pip call when it differs, none when
right).  Applied before the router's unit is checked: systemd-analyze wants its interpreter."""
from specops.inventory import schema
from specops.ops import handlers
from specops import protocol
from specops.ops import Op, Venv
from specops.kinds import kind_of, of_kind
from specops.sglang.indexes import pip_sources
from specops.layout import venv_python

NAME = "router_stack"
VARS = {**schema.INDEX_VARS, "python": schema.STACK_VARS["python"]}  # the host vars it reads
AFTER = ("sglang_service",)  # the roles it runs after, when they run
REPROBE = True  # the unit that follows names the interpreter this installs
DEFAULT_VERSION = "0.3.2"
IMPORT_CHECK = ("import json, importlib.metadata as md, sglang_router; "
                "print(json.dumps({'sglang-router': md.version('sglang-router')}))")


class RouterPackage(Op):
    """sglang-router at its pin in the router's venv (one pip call when it differs, none when right)."""

    def __init__(self, host, svc, venv):
        self.host, self.svc, self.venv = host, svc, venv
        self.version = svc.get("version", DEFAULT_VERSION)

    def wants(self):
        return protocol.Probe(venvs=[self.venv])

    def plan(self, facts, ctx):
        have = (facts.venv(self.venv).get("packages") or {}).get("sglang-router")
        target = f"sglang-router in {self.venv}"
        if have == self.version:
            return self._change(target, "ok")
        python = venv_python(self.venv)
        spec = f"sglang-router=={self.version}"
        return self._change(
            target,
            f"{have or 'missing'} → {self.version}",
            [
                protocol.PipInstall(
                    python=python, specs=[spec], sources=pip_sources(self.host), desc=f"pip install {spec}"
                ),
                protocol.Expect(
                    python=python,
                    code=IMPORT_CHECK,
                    expect={"sglang-router": self.version},
                    what=f"after installing, the venv {self.venv} imports",
                    desc="import sglang_router",
                ),
            ],
            notify=[handlers.restart(self.svc["name"])],
        )


def ops(host):
    out = []
    for svc in of_kind(host, "router"):
        venv = kind_of(svc).venv(svc)
        out += [Venv(venv, host.get("python")), RouterPackage(host, svc, venv)]
    return out
