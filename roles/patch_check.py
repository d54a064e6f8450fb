"""Before anything moves: the patches checked against the SGLang of a stack still to be built.

A new stack is built beside the one that serves, and a diff patch is applied to the installed
file of its SGLang.  So that a patch that does not fit that version is refused before any byte
moves (not after the stack is built), its files are read from the new version's wheel, in
memory on the host (specops/agent/converge/wheelfiles.py), or from the controller's wheelhouse.
Once the stack is built, model_patches checks against what is installed, as ever."""
import base64
import zipfile
from pathlib import Path

from roles.model_patches import patch_source
from specops import protocol
from specops.ops import Op, PlanError
from specops.services import of_kind, venv_of
from specops.services.sglang import DIFF_SUFFIX, patched_file
from specops.sglang import patchfile, stack

NAME = "patch_check"


class NewStackPatches(Op):
    """Each patch fits the sglang of the host's stack, read from its wheel while it is not built."""

    def __init__(self, host, patches):
        self.host, self.patches, self.venv = host, patches, venv_of(host)
        self.version = host["sglang"]["version"]
        self.files = [f"sglang/{patched_file(rel)}" for rel in patches]

    def wants(self):
        if self.host.get("wheelhouse"):  # the controller has the wheel: read here, after the probe
            return protocol.Probe(stacks=True)
        return protocol.Probe(stacks=True, wheel_files=stack.wheel_request(self.host, self.files))

    def plan(self, facts, ctx):
        target = f"patches against sglang {self.version}"
        if any(s["path"] == self.venv for s in facts.stacks):
            return self._change(target, "ok")  # its stack is built: model_patches reads the installed files
        got = self._local() if self.host.get("wheelhouse") else facts.data.get("wheel_files") or {}
        if "error" in got:
            raise PlanError(f"{self.host.name}: cannot read sglang {self.version}'s files to check the patches "
                            f"before its stack is built: {got['error']}")
        for rel, text in self.patches.items():
            f = got.get(f"sglang/{patched_file(rel)}")
            if f is None:
                raise PlanError(f"{self.host.name}: patch {rel}: sglang {self.version} has no {patched_file(rel)}")
            upstream = base64.b64decode(f["content_b64"]).decode()
            if rel.endswith(DIFF_SUFFIX):
                patchfile.apply(text, upstream, patched_file(rel), self.version)
            else:
                patchfile.check_whole_file(text, patched_file(rel), self.version, f["sha256"],
                                           bool(self.host.get("patch_any_base")))
        return self._change(target, "ok")

    def _local(self):
        prefix = f"sglang-{self.version}-"
        wheels = sorted(Path(self.host["wheelhouse"]).expanduser().glob(prefix + "*.whl"))
        if not wheels:
            return {"error": f"no {prefix}*.whl in the wheelhouse {self.host['wheelhouse']}"}
        out = {}
        with zipfile.ZipFile(wheels[0]) as z:
            for path in self.files:
                data = z.read(path) if path in z.namelist() else None
                out[path] = None if data is None else {"sha256": patchfile.upstream_sha256(data),
                                                       "content_b64": base64.b64encode(data).decode()}
        return out


def ops(host):
    if not stack.defines(host) or not host.get("sglang"):
        return []
    patches = {}
    for svc in of_kind(host, "sglang"):
        for rel in svc.get("patches") or []:
            patches[rel] = patch_source(host, rel, f"{host.name}: service {svc['name']!r}").read_text()
    return [NewStackPatches(host, patches)] if patches else []
