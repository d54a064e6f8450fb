"""`inv patch`: a diff patch made from the upstream file of the SGLang the inventory asks for and
a local edited copy, or an existing one rebased onto that SGLang.  The upstream file is read where
it is installed when its stack is built, else from that version's wheel by the one reader the
patch check uses (the controller's wheelhouse, or the host's indexes): the upgrade steps work
before the new stack exists.  Whatever it writes is written locally, for review: never onto the
host; whole (a new file renamed over the old); for `--edited`, only once the diff passes the
patch check deploy runs (patchlint), the edited copy's conflict markers refused before any
connection; for `--rebase`, with the other output of an earlier rebase onto that version removed.
The commands its messages name can be pasted: they repeat the run's inventory and host."""
from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Callable

from .. import kinds, owndir, protocol, usertext
from ..agent.converge.wheelfiles import SourceError
from ..errors import SpecopsError, UsageError
from ..run import HostRun
from ..kinds.sglang import DIFF_SUFFIX, patch_key, patched_file
from ..sglang import patches, patchfile, patchlint, stack

# What a three-way merge leaves at a conflict (merge3's, git's, diff3's): seven of one sign, then a
# name or nothing.
_MARKER = re.compile(r"(<{7}|\|{7}|>{7})( |$)")


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


def body(host, file: str, edited: str | None, does: str) -> Callable[[HostRun], str]:
    """What `inv patch` runs on the host (`does`: "edited", "fetch" or "rebase"), once what it was
    given is checked: a UsageError, before any connection, for what could never work."""
    rel, diff = target(patches.patch_root(host), file)
    if does == "edited":
        path = Path(edited).expanduser()
        text = _edited(path)
        return lambda run: make(run, rel, path, text, diff)
    if does == "fetch":
        return lambda run: fetch(run, rel, Path(Path(rel).name))
    if not diff.is_file():
        raise UsageError(f"{diff} does not exist: nothing to rebase")
    return lambda run: rebase(run, diff, rel)


def _edited(path: Path) -> str:
    """An edited copy's text; refused when it cannot be read, or still holds a conflict's markers."""
    text = usertext.read(path)  # UTF-8, as the upstream file is read
    for n, line in enumerate(text.split("\n"), 1):
        # A line of seven "=" alone is a heading's underline in a docstring too: a conflict left
        # with its other markers taken out is for the compile check to find.
        if _MARKER.match(line):
            raise UsageError(f"{path}: line {n} is a conflict marker ({line.rstrip()}): resolve each conflict, "
                             f"keeping no markers, then --edited it again; nothing written")
    return text


def make(run: HostRun, rel: str, edited: Path, text: str, out: Path) -> str:
    """`out`: the diff of the edited copy (`text`) against the inventory's SGLang's file, written
    only once the patched file passes deploy's check; until then, what was at `out` stays."""
    up, version, sha = upstream(run, rel)
    try:
        diff = patchfile.make(rel, up, text, version, sha)
        patchlint.check_edited(diff, up, text, rel, version)
    except patchfile.PatchError as e:
        raise SpecopsError(f"refused {edited}, nothing written: {e}") from None
    _write(out, diff)
    return f"wrote {out}: a diff against sglang {version}'s {rel}"


def fetch(run: HostRun, rel: str, out: Path) -> str:
    text, version, _ = upstream(run, rel)
    _write(out, text)
    return f"wrote {out}: sglang {version}'s {rel}, to edit"


def rebase(run: HostRun, patch: Path, rel: str) -> str:
    """FILE.patch.<version> (a clean merge) or FILE.merge-<version> (conflicts), and never both:
    an earlier rebase's other file onto the same version goes, said."""
    diff = patch.read_text()
    base = patchfile.base_of(diff)
    new, new_version, new_sha = upstream(run, rel)
    old, old_version, old_sha = _base_upstream(run, base.version if base else None, rel, kinds.venv_of(run.host))
    if base and base.sha256 and base.sha256 != old_sha:
        raise SpecopsError(f"{patch.name} was cut from the file with sha256 {base.sha256[:8]}…, but sglang "
                           f"{old_version}'s {rel} has {old_sha[:8]}…: cannot rebase from it")
    try:
        text, conflicts = patchfile.rebase(diff, old, new, rel, new_version, new_sha)
    except patchfile.HunkError as e:  # no merge can start from a patch that does not fit its own base
        raise SpecopsError(f"{e}: {patch.name} does not fit the file it says it was cut from; make its edit on "
                           f"sglang {new_version}'s ({run.hint('patch', rel, '--fetch')} writes it), then "
                           f"--edited it") from None
    clean, merge = Path(f"{patch}.{new_version}"), patch.with_name(f"{Path(rel).name}.merge-{new_version}")
    if conflicts:
        _write(merge, text)
        named = "; ".join(str(c) for c in conflicts)
        raise SpecopsError(f"{len(conflicts)} conflict(s) rebasing {patch.name} from sglang {old_version} onto "
                           f"{new_version}: {named}{_gone(clean)}. Resolve them in {merge} (diff3 markers: the "
                           f"patch's side, the base, sglang {new_version}'s), then: "
                           f"{run.hint('patch', rel, '--edited', str(merge))}")
    _write(clean, text)
    gone = _gone(merge)
    try:
        patchlint.apply_checked(text, new, rel, new_version)
    except patchfile.PatchError as e:
        raise SpecopsError(f"wrote {clean}, but it must not be used as it is: {e}{gone}") from None
    return f"wrote {clean}: {patch.name} rebased from sglang {old_version} onto {new_version}; review it, then " \
           f"move it over {patch.name}{gone}"


def _gone(path: Path) -> str:
    """An earlier rebase's output that this one replaces, removed: its words for the message."""
    try:
        path.unlink()
    except FileNotFoundError:
        return ""
    return f" (removed {path.name}, an earlier rebase's)"


def _write(out: Path, text: str) -> None:
    """Whole or not at all: a reader, or a run cut short, finds the old file or the new one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    owndir.write_whole(out, text.encode(), 0o644)


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
