"""A host's patches as the controller finds them: the local file of a patch path (its
`patch_dir`, else files/patches), what a patch says it provides, and a diff applied to an
upstream file and checked (patchfile, patchlint), with what to do when a hunk no longer fits.
Read by the roles that check, apply and depend on patches (patch_check, model_patches,
draft_config) and by `inv patch`."""
from __future__ import annotations

import posixpath
from pathlib import Path

from .. import again
from ..errors import UsageError

PATCH_DIR = Path(__file__).resolve().parent.parent.parent / "files" / "patches"
# A patch that makes the model capture the embedding output (EAGLE-3 layer id -1) says so.
EMBEDDING_CAPTURE_MARKER = "specops: provides embedding-capture"


def patch_root(host) -> Path:
    return Path(host.get("patch_dir") or PATCH_DIR).expanduser().resolve()


def patch_source(host, rel: str, where: str) -> Path:
    """The local file for a patch path inside the sglang package; refuses anything outside."""
    root = patch_root(host)
    norm = posixpath.normpath(rel)
    if rel.startswith("/") or norm.startswith("..") or norm != rel.rstrip("/") or "\\" in rel:
        raise UsageError(f"{where}: patch {rel!r} must be a plain relative path inside the sglang package")
    src = (root / norm).resolve()
    if root not in src.parents:
        raise UsageError(f"{where}: patch {rel!r} points outside {root}")
    if not src.is_file():
        raise UsageError(f"{where}: patch {rel!r} not found: expected {src}")
    return src


def provides_embedding_capture(host, svc: dict) -> bool:
    return any(EMBEDDING_CAPTURE_MARKER in patch_source(host, rel, host.name).read_text()
               for rel in svc.get("patches") or [])


def applied(host, diff: str, upstream: str, rel: str, version: str) -> str:
    """The diff applied and checked (patchlint); a hunk with no one place says how to carry it on."""
    # Only when a diff is applied: whatthepatch, merge3 and pyflakes are not every task's to import.
    from . import patchfile, patchlint
    try:
        return patchlint.apply_checked(diff, upstream, rel, version)
    except patchfile.HunkError as e:
        # A three-way merge from the file the patch was cut from places each hunk by that whole
        # file: one that has no place here, or several, included.
        raise patchfile.HunkError(f"{e}; carry it onto sglang {version} with: "
                                  f"{again.command('patch', rel, '--rebase', host=host.name)}") from None
