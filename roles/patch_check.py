"""Before anything moves: the patches checked against the SGLang of a stack still to be built.

A new stack is built beside the one that serves, and a diff patch is applied to the installed
file of its SGLang.  So that a patch that does not fit that version is refused before any byte
moves (not after the stack is built), its files are read from the new version's wheel with the
one reader (specops/agent/converge/wheelfiles.py): the controller's wheelhouse where the host
has one, else in memory on the host from the indexes its stack is built from.  A diff must
apply, and the patched file must compile and add no run-time name error (specops/sglang/patchlint.py).
Once the stack is built, model_patches checks against what is installed, as ever."""
from specops.inventory import schema
from specops.sglang.patches import applied, patch_source
from specops import protocol
from specops.ops import Op, PlanError
from specops.kinds import of_kind, venv_of
from specops.kinds.sglang import DIFF_SUFFIX, patched_file
from specops.sglang import stack

NAME = "patch_check"
VARS = {**schema.STACK_VARS, **schema.INDEX_VARS, **schema.PATCH_VARS}  # the host vars it reads
AFTER = ("gpu_fit", "system_packages")  # the roles it runs after, when they run (a bare box gets its tools first)


class NewStackPatches(Op):
    """Each patch fits the sglang of the host's stack, read from its wheel while it is not built."""

    def __init__(self, host, patches):
        self.host, self.patches, self.venv = host, patches, venv_of(host)
        self.version = host["sglang"]["version"]
        self.files = [f"sglang/{patched_file(rel)}" for rel in patches]

    def wants(self):
        return protocol.Probe(stacks=True, wheel_files=stack.wheel_request(self.host, self.files))

    def plan(self, facts, ctx):
        target = f"patches against sglang {self.version}"
        if any(s["path"] == self.venv for s in facts.stacks):
            return self._change(target, "ok")  # its stack is built: model_patches reads the installed files
        # Only when a wheel's files are read and a patch checked against them: urllib, whatthepatch and
        # pyflakes are not every task's to import.
        from specops.agent.converge.wheelfiles import SourceError
        from specops.sglang import patchfile, patchlint
        try:
            got = stack.wheel_files(self.host, self.files, facts.data.get("wheel_files") or {})
        except SourceError as e:
            raise PlanError(f"{self.host.name}: cannot read sglang {self.version}'s files to check the patches "
                            f"before its stack is built: {e}") from None
        for rel, text in self.patches.items():
            inner = patched_file(rel)
            data = got.get(f"sglang/{inner}")
            if data is None:
                raise PlanError(f"{self.host.name}: patch {rel}: sglang {self.version} has no {inner}")
            if rel.endswith(DIFF_SUFFIX):
                applied(self.host, text, data.decode(), inner, self.version)
            else:
                patchfile.check_whole_file(text, inner, self.version, patchfile.upstream_sha256(data),
                                           bool(self.host.get("patch_any_base")))
                if inner.endswith(".py"):
                    patchlint.check(data.decode(), text, inner, self.version)
        return self._change(target, "ok")


def ops(host):
    if not stack.defines(host) or not host.get("sglang"):
        return []
    patches = {}
    for svc in of_kind(host, "sglang"):
        for rel in svc.get("patches") or []:
            patches[rel] = patch_source(host, rel, f"{host.name}: service {svc['name']!r}").read_text()
    return [NewStackPatches(host, patches)] if patches else []
