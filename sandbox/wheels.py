"""Write pure-Python wheels directly (PEP 427): no build backend needed on the controller.

Used for the SGLang simulator and the stand-in CUDA torch wheels.
"""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build(dest: Path, name: str, version: str, files: dict[str, bytes],
          requires: list[str] = (), summary: str = "") -> Path:
    """files maps paths inside site-packages to content."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    entries = dict(sorted(files.items()))
    entries[f"{dist}.dist-info/METADATA"] = ("\n".join(meta) + "\n").encode()
    entries[f"{dist}.dist-info/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: specops-sandbox\n"
                                          b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = "".join(f"{p},{_digest(d)},{len(d)}\n" for p, d in entries.items())
    entries[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in entries.items():
            info = zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible bytes
            info.external_attr = 0o644 << 16
            z.writestr(info, d, zipfile.ZIP_DEFLATED)
    return path


def _py_files(root: Path, package: str) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted((root / package).rglob("*.py")) if "__pycache__" not in p.parts}


def from_tree(dest: Path, name: str, version: str, root: Path, package: str, overlays: list[Path] = (),
              generated: dict[str, bytes] | None = None, **kw) -> Path:
    """The package's .py files under root; then, overlay by overlay, those under each overlay root
    (holding <package>/... of its own) replace the files of the same path or add to them; then
    `generated` (path -> content) replaces all.  One tree thus gives several releases."""
    files = _py_files(root, package)
    for overlay in overlays:
        files.update(_py_files(overlay, package))
    files.update(generated or {})
    return build(dest, name, version, files, **kw)
