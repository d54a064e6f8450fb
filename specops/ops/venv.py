"""A venv a role installs into: there, sound, and made by the Python version asked for (the
SGLang stack when the host manages its own venv, the router's venv)."""
from __future__ import annotations

from .. import protocol
from .base import Op, PlanError


class Venv(Op):
    """The service venv exists, made by the Python version asked for."""

    def __init__(self, path, python=None):
        self.path, self.python = path, python

    def wants(self):
        return protocol.Probe(venvs=[self.path])

    def plan(self, facts, ctx):
        v = facts.venv(self.path)
        if v.get("exists"):
            if v.get("broken"):
                raise PlanError(f"venv {self.path} is broken: {v['broken']}")
            if self.python and not (v["version"] + ".").startswith(self.python + "."):
                raise PlanError(f"venv {self.path} has Python {v['version']}, not {self.python}; "
                                f"move it away to have it rebuilt")
            return self._change(f"venv {self.path}", "ok")
        facts.assume_venv(self.path, {"exists": True, "packages": {}, "torch_cuda": None, "planned": True})
        interpreter = f"python{self.python}" if self.python else "python3"
        return self._change(f"venv {self.path}", f"create with {interpreter}", [protocol.Run(
            cmd=[interpreter, "-m", "venv", self.path], desc=f"create venv {self.path} ({interpreter})")])
