"""`inv patch`: a diff patch made from the host's installed upstream file and a local edited copy,
or an existing one rebased onto the SGLang of the stack the inventory now asks for.  Whatever it
writes is written locally, for review: never onto the host."""
from __future__ import annotations

import base64
from pathlib import Path

from .. import protocol, services
from ..errors import SpecopsError, UsageError
from ..run import HostRun
from ..services.sglang import DIFF_SUFFIX, patch_key, patched_file
from ..sglang import patchfile, stack


def _upstream(run: HostRun, venv: str, rel: str) -> tuple[str, str, str]:
    """(text, version, sha256) of the upstream file `rel` of the sglang installed in `venv`."""
    key = patch_key(venv, rel)
    facts = run.probe([], protocol.Probe(venvs=[venv], upstream=[key]))
    if not facts.venv(venv).get("exists"):
        raise SpecopsError(f"{run.host.name}: {venv} does not exist: deploy first (a refused patch leaves its "
                           f"new stack built, for this)")
    up = facts.upstream(key)
    if not up.get("path"):
        raise SpecopsError(f"{run.host.name}: sglang/{rel} is not in the sglang installed in {venv}")
    if up.get("content_b64") is None:
        raise SpecopsError(f"{run.host.name}: the upstream sglang/{rel} of sglang {up.get('version')} in {venv} "
                           f"is not known (patched, and no copy kept)")
    return base64.b64decode(up["content_b64"]).decode(), up["version"], up["sha256"]


def _older_stack(run: HostRun, version: str | None, rel: str, exclude: str) -> tuple[str, str, str]:
    """The upstream file of the stack on the host with sglang `version` (the one the patch was cut
    from), else of the current release's."""
    facts = run.probe([], protocol.Probe(stacks=True))
    stacks = [s for s in facts.stacks if s["path"] != exclude]
    pick = [s for s in stacks if s["packages"].get("sglang") == version] or []
    if not pick:
        current = run.call(protocol.Releases())
        venv = next((r.get("venv") for r in current.releases if r["current"]), None)
        pick = [s for s in stacks if s["path"] == venv]
    if not pick:
        raise SpecopsError(f"{run.host.name}: no stack with sglang {version or '?'} to rebase from")
    return _upstream(run, pick[0]["path"], rel)


def make(run: HostRun, rel: str, edited: Path, out: Path) -> str:
    text, version, sha = _upstream(run, services.venv_of(run.host), rel)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(patchfile.make(rel, text, edited.read_text(), version, sha))
    return f"wrote {out}: a diff against sglang {version}'s {rel}"


def fetch(run: HostRun, rel: str, out: Path) -> str:
    text, version, _ = _upstream(run, services.venv_of(run.host), rel)
    out.write_text(text)
    return f"wrote {out}: sglang {version}'s {rel}, to edit"


def _new_upstream(run: HostRun, rel: str) -> tuple[str, str, str]:
    """The file of the SGLang the inventory asks for: installed in its stack, or, while the stack
    is not built, read from its wheel in memory on the host."""
    venv = services.venv_of(run.host)
    if not stack.defines(run.host) or not run.host.get("sglang"):
        return _upstream(run, venv, rel)
    got = run.probe([], protocol.Probe(stacks=True, wheel_files=stack.wheel_request(run.host, [f"sglang/{rel}"])))
    if any(s["path"] == venv for s in got.stacks):
        return _upstream(run, venv, rel)
    files = got.data.get("wheel_files") or {}
    f = files.get(f"sglang/{rel}")
    if f is None:
        raise SpecopsError(f"{run.host.name}: sglang {run.host['sglang']['version']}'s {rel}: "
                           f"{files.get('error') or 'not in its wheel'}")
    return base64.b64decode(f["content_b64"]).decode(), run.host["sglang"]["version"], f["sha256"]


def rebase(run: HostRun, patch: Path, rel: str) -> str:
    diff = patch.read_text()
    base = patchfile.base_of(diff)
    new_venv = services.venv_of(run.host)
    new, new_version, new_sha = _new_upstream(run, rel)
    old, old_version, _ = _older_stack(run, base.version if base else None, rel, new_venv)
    text, conflicts = patchfile.rebase(diff, old, new, rel, new_version, new_sha)
    if conflicts:
        out = patch.with_name(Path(rel).name + f".merge-{new_version}")
        out.write_text(text)
        raise SpecopsError(f"{conflicts} conflict(s) rebasing {patch.name} from sglang {old_version} onto "
                           f"{new_version}: resolve them in {out}, then make the patch from it (--edited)")
    out = Path(str(patch) + f".{new_version}")
    out.write_text(text)
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
