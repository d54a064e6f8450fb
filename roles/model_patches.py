"""Patched SGLang model files: compiled by the service's own interpreter (or here, once, when
this interpreter writes the same bytecode), placed atomically, their bytecode purged, the
service restarted.

A patch is a unified diff against SGLang's file (`<file>.patch`), applied to the file of the
version installed in the stack, or a whole file that says which upstream file it replaces
(specops/sglang/patchfile.py).  Either is refused, before anything changes, when the installed
upstream file is not one it fits, or when the patched file has a name error the upstream file
has not (specops/sglang/patchlint.py: compiling cannot see those).
"""
import base64
import posixpath

from specops.inventory import schema
from specops import protocol
from specops.ops import handlers
from specops.layout import BYTECODE_LINE, CHECKED_HASH
from specops.ops import File, PlanError, PurgeBytecode
from specops.ops.code import precompiled
from specops.kinds import of_kind, venv_of
from specops.kinds.sglang import DIFF_SUFFIX, patch_key, patched_file
from specops.sglang.patches import applied, patch_source
from specops.layout import venv_python

NAME = "model_patches"
VARS = {**schema.STACK_VARS, **schema.PATCH_VARS}  # the host vars it reads
AFTER = ("gpu_stack",)  # the roles it runs after, when they run
# Compile each staged file, say what is wrong in one line, and take many files ("{}..." in a
# validator means every staged file: one interpreter checks every patched file of a batch).
# What it compiled goes to stdout as a checked-hash .pyc (PEP 552; layout.BYTECODE_LINE), with
# the hash of what it read (the agent refuses other content than it staged): the agent, not
# this root process, writes it once the source is in place (specops.agent.converge.bytecode).  The
# interpreter checks it against the source on every import, and the service need not compile
# the module again.
COMPILE = ("import base64, hashlib, json, marshal, os, stat, sys, warnings\n"
           "from importlib.util import MAGIC_NUMBER, cache_from_source, source_hash\n"
           "warnings.simplefilter('ignore')  # a warning would print a line of what it read\n"
           "for path in sys.argv[1:]:\n"
           "    try:  # the staged file itself: never a link's target, a FIFO or a device\n"
           "        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)\n"
           "    except OSError as e:\n"
           "        sys.exit('%s: %s' % (path, e.strerror))\n"
           "    with os.fdopen(fd, 'rb') as f:\n"
           "        if not stat.S_ISREG(os.fstat(fd).st_mode):\n"
           "            sys.exit('%s: not a regular file' % path)\n"
           "        source = f.read()\n"
           "    try:\n"
           "        code = compile(source, path, 'exec', dont_inherit=True)\n"
           "    except SyntaxError as e:\n"
           "        sys.exit('%s: %s: %s (line %s)' % (path, type(e).__name__, e.msg, e.lineno))\n"
           "    try:\n"
           "        name = os.path.basename(cache_from_source(path))\n"
           f"        pyc = MAGIC_NUMBER + {CHECKED_HASH!r} + source_hash(source) + marshal.dumps(code)\n"
           "    except NotImplementedError:  # no bytecode cache here: what was read is still said\n"
           "        name, pyc = '', b''\n"
           f"    print({BYTECODE_LINE!r} + json.dumps([path, hashlib.sha256(source).hexdigest(), name,\n"
           "                                   base64.b64encode(pyc).decode()]))\n")


class Patched(File):
    """A patched file whose content depends on the installed upstream file: a diff applied to it,
    or a whole file checked against it."""

    def __init__(self, host, key, rel, text: bytes, any_base: bool, **kw):
        super().__init__(key, text, **kw)
        self.host, self.rel, self.text, self.any_base = host, patched_file(rel), text, any_base
        self.is_diff = rel.endswith(DIFF_SUFFIX)
        self.module = posixpath.basename(self.rel)[:-3]

    def wants(self):
        return protocol.Probe(files=[self.path], upstream=[self.path],
                              content={self.path: "always" if self.is_diff else self.sha256})

    def plan(self, facts, ctx):
        up = facts.upstream(self.path)
        if facts.venv(self.path.split(":")[1]).get("planned"):  # check mode, before a new stack is built
            return self._change(
                self.label, f"{'apply the diff to' if self.is_diff else 'replace'} the new stack's file"
            )
        # Only when a patch is checked: whatthepatch and pyflakes are not every task's to import.
        from specops.sglang import patchfile, patchlint
        version = up.get("version") or "?"
        if self.is_diff:
            if up.get("content_b64") is None:
                raise PlanError(f"{self.label}: the upstream file of sglang {version} is not on the host (the "
                                f"installed file differs from what its RECORD says, and no copy was kept); "
                                f"rebuild the stack to apply {self.rel}{DIFF_SUFFIX} to it")
            upstream = base64.b64decode(up["content_b64"])
            self.content = applied(self.host, self.text.decode(), upstream.decode(), self.rel, version).encode()
            self.sha256 = patchfile.upstream_sha256(self.content)
        else:
            patchfile.check_whole_file(self.text.decode(), self.rel, version, up.get("sha256"), self.any_base)
            if up.get("content_b64") is not None and self.rel.endswith(".py"):
                patchlint.check(base64.b64decode(up["content_b64"]).decode(), self.text.decode(), self.rel, version)
        c = super().plan(facts, ctx)
        for write in (a for a in c.actions if isinstance(a, protocol.Write) and a.validate):
            # Compiled here when the host's interpreter writes the same bytecode: not on every host.
            made = precompiled(self.content, facts.venv(self.path.split(":")[1]), self.module, self.label)
            if made:
                write.validate, write.validator, write.bytecode = None, None, made
        f = facts.file(self.path)
        if self.is_diff and c.actions and up.get("sha256") and not up.get("kept") and not f.get("kept_upstream"):
            # Keep the upstream file before it is replaced: the diff is applied to it again later.
            c.actions[:0] = [protocol.KeepUpstream(sha256=up["sha256"], data=up["content_b64"],
                                                   desc=f"keep sglang {version}'s {self.rel} (upstream)")]
            facts.assume_file(self.path, kept_upstream=True)
        return c


def ops(host):
    venv = venv_of(host)
    patches: dict[str, list[str]] = {}  # one file may serve several services in a venv
    for svc in of_kind(host, "sglang"):
        for rel in svc.get("patches") or []:
            patch_source(host, rel, f"{host.name}: service {svc['name']!r}")
            patches.setdefault(rel, []).append(handlers.restart(svc["name"]))
    out = []
    for rel, restarts in patches.items():
        key, label = patch_key(venv, rel), f"sglang/{patched_file(rel)}"
        # -I -S: compiling needs no site-packages, whose .pth files cost a big venv's start much CPU
        validate = (
            [venv_python(venv), "-I", "-S", "-c", COMPILE, "{}..."] if patched_file(rel).endswith(".py") else None
        )
        out.append(
            Patched(
                host,
                key,
                rel,
                patch_source(host, rel, host.name).read_bytes(),
                bool(host.get("patch_any_base")),
                mode="0644",
                owner=None,
                group=None,
                validate=validate,
                notify=restarts,
                label=label,
                validator=f"compiling with {venv_python(venv)}",
            )
        )
        if patched_file(rel).endswith(".py"):
            out.append(PurgeBytecode(key, label=label, notify=restarts))
    return out
