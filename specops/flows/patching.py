"""`inv patch`: a diff patch made from the upstream file of the SGLang the inventory asks for and
a local edited copy, or an existing one rebased onto that SGLang.  The upstream file is read where
it is installed when its stack is built, else from that version's wheel by the one reader the
patch check uses (the controller's wheelhouse, or the host's indexes): the upgrade steps work
before the new stack exists.  Whatever it writes is written locally, for review: never onto the
host."""
from __future__ import annotations

import base64
from pathlib import Path

from .. import kinds, protocol
from ..agent.converge.wheelfiles import SourceError
from ..errors import SpecopsError, UsageError
from ..run import HostRun
from ..kinds.sglang import DIFF_SUFFIX, patch_key, patched_file
from ..sglang import patchfile, patchlint, stack


def _installed(run: HostRun, venv: str, rel: str, facts=None) -> tuple[str, str, str]:
    """(text, version, sha256) of the upstream file `rel` of the sglang installed in `venv` (from
    `facts` when a probe asked for it already)."""
    key = patch_key(venv, rel)
    facts = facts or run.probe([], protocol.Probe(venvs=[venv], upstream=[key]))
    if not facts.venv(venv).get("exists"):
        raise SpecopsError(f"{run.host.name}: {venv} does not exist, and the inventory pins no sglang version "
                           f"whose wheel could be read instead")
    up = facts.upstream(key)
    if not up.get("path"):
        raise SpecopsError(f"{run.host.name}: sglang/{rel} is not in the sglang installed in {venv}")
    if up.get("content_b64") is None:
        # Patched in place, with no copy kept (a whole-file patch): the wheel still has it, and the
        # RECORD's sha256 says it is the one installed.
        if not up.get("version"):
            raise SpecopsError(f"{run.host.name}: the upstream sglang/{rel} in {venv} is not known (patched, no "
                               f"copy kept, and no version to read its wheel)")
        text, version, sha = _from_wheel(run, rel, up["version"])
        if up.get("sha256") and sha != up["sha256"]:
            raise SpecopsError(f"{run.host.name}: sglang {version}'s wheel has another {rel} (sha256 {sha[:8]}…) "
                               f"than the one installed in {venv} ({up['sha256'][:8]}…)")
        return text, version, sha
    return base64.b64decode(up["content_b64"]).decode(), up["version"], up["sha256"]


def _from_wheel(run: HostRun, rel: str, version: str | None = None, facts=None) -> tuple[str, str, str]:
    """(text, version, sha256) of `rel` in sglang `version`'s wheel (default: the inventory's)."""
    version = version or run.host["sglang"]["version"]
    path = f"sglang/{rel}"
    if facts is None:
        facts = run.probe([], protocol.Probe(wheel_files=stack.wheel_request(run.host, [path], version)))
    try:
        data = stack.wheel_files(run.host, [path], facts.data.get("wheel_files") or {}, version)[path]
    except SourceError as e:
        raise SpecopsError(f"{run.host.name}: cannot read sglang {version}'s {rel}: {e}") from None
    if data is None:
        raise SpecopsError(f"{run.host.name}: sglang {version} has no {rel}")
    return data.decode(), version, patchfile.upstream_sha256(data)


def upstream(run: HostRun, rel: str) -> tuple[str, str, str]:
    """The file of the SGLang the inventory asks for: installed in its stack, or, while the stack
    is not built, read from its wheel."""
    venv = kinds.venv_of(run.host)
    if not stack.defines(run.host) or not run.host.get("sglang"):
        return _installed(run, venv, rel)
    # One round trip whichever it is: the host reads no wheel for a stack that is built.
    facts = run.probe([], protocol.Probe(stacks=True, venvs=[venv], upstream=[patch_key(venv, rel)],
                                         wheel_files=stack.wheel_request(run.host, [f"sglang/{rel}"])))
    if any(s["path"] == venv for s in facts.stacks):
        return _installed(run, venv, rel, facts)
    return _from_wheel(run, rel, facts=facts)


def _base_upstream(run: HostRun, version: str | None, rel: str, exclude: str) -> tuple[str, str, str]:
    """The upstream file the patch was cut from: of a stack on the host with sglang `version`,
    else read from that version's wheel; with no version named, the current release's."""
    facts = run.probe([], protocol.Probe(stacks=True))
    stacks = [s for s in facts.stacks if s["path"] != exclude]
    pick = [s for s in stacks if version and s["packages"].get("sglang") == version]
    if pick:
        return _installed(run, pick[0]["path"], rel)
    if version:
        return _from_wheel(run, rel, version)
    current = run.call(protocol.Releases())
    venv = next((r.get("venv") for r in current.releases if r["current"]), None)
    if not venv:
        raise SpecopsError(f"{run.host.name}: the patch names no sglang version it was cut from, and no release "
                           f"runs one to rebase from")
    return _installed(run, venv, rel)


def make(run: HostRun, rel: str, edited: Path, out: Path) -> str:
    text, version, sha = upstream(run, rel)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(patchfile.make(rel, text, edited.read_text(), version, sha))
    return f"wrote {out}: a diff against sglang {version}'s {rel}"


def fetch(run: HostRun, rel: str, out: Path) -> str:
    text, version, _ = upstream(run, rel)
    out.write_text(text)
    return f"wrote {out}: sglang {version}'s {rel}, to edit"


def rebase(run: HostRun, patch: Path, rel: str) -> str:
    diff = patch.read_text()
    base = patchfile.base_of(diff)
    new, new_version, new_sha = upstream(run, rel)
    old, old_version, old_sha = _base_upstream(run, base.version if base else None, rel, kinds.venv_of(run.host))
    if base and base.sha256 and base.sha256 != old_sha:
        raise SpecopsError(f"{patch.name} was cut from the file with sha256 {base.sha256[:8]}…, but sglang "
                           f"{old_version}'s {rel} has {old_sha[:8]}…: cannot rebase from it")
    text, conflicts = patchfile.rebase(diff, old, new, rel, new_version, new_sha)
    if conflicts:
        out = patch.with_name(Path(rel).name + f".merge-{new_version}")
        out.write_text(text)
        named = "; ".join(str(c) for c in conflicts)
        raise SpecopsError(f"{len(conflicts)} conflict(s) rebasing {patch.name} from sglang {old_version} onto "
                           f"{new_version}: {named}. Resolve them in {out} (diff3 markers: the patch's side, the base, "
                           f"sglang {new_version}'s), then: {run.hint('patch', rel, '--edited', str(out))}")
    out = Path(str(patch) + f".{new_version}")
    out.write_text(text)
    try:
        patchlint.apply_checked(text, new, rel, new_version)
    except patchfile.PatchError as e:
        raise SpecopsError(f"wrote {out}, but it must not be used as it is: {e}") from None
    return f"wrote {out}: {patch.name} rebased from sglang {old_version} onto {new_version}; review it, then move " \
           f"it over {patch.name}"


def target(patch_root: Path, file: str) -> tuple[str, Path]:
    """(the file inside the sglang package, its .patch under the patch directory) for FILE as given:
    srt/models/deepseek_v2.py, the same with .patch, or the path of a .patch in the patch directory."""
    p = Path(file).expanduser()
    if p.is_file() and patch_root in p.resolve().parents:
        file = str(p.resolve().relative_to(patch_root))
    rel = patched_file(file)
    if rel.startswith("/") or ".." in Path(rel).parts or not rel:
        raise UsageError(f"{file}: name a file inside the sglang package, e.g. srt/models/deepseek_v2.py")
    return rel, patch_root / (rel + DIFF_SUFFIX)
