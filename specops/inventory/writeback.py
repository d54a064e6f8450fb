"""Writing a tuned service's speculative settings back into its host's vars file (`inv spec-tune
--apply`), keeping the file's comments, key order and quoting: ruamel.yaml's round trip, the one
maintained YAML library that keeps comments (PyYAML drops them on load).  Only the service's
`speculative` keys that change are touched; the file is replaced whole, by rename."""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

from ..errors import UsageError


def vars_file(inventory: Path, host: str) -> Path:
    """host_vars/<host>.yml (or .yaml) of an inventory directory (or of the one a hosts file is in)."""
    root = inventory if inventory.is_dir() else inventory.parent
    for ext in (".yml", ".yaml"):
        path = root / "host_vars" / f"{host}{ext}"
        if path.is_file():
            return path
    raise UsageError(f"{root / 'host_vars' / (host + '.yml')}: no such file: the tuned settings go into the "
                     f"file that defines the host's service")


def write_speculative(path: Path, service: str, values: dict, dry: bool = False) -> bool:
    """Set `values` under the service's `speculative:` in the vars file; False when they are there
    already (the file is then left untouched, byte for byte).  `dry`: check that it can, write nothing."""
    from ruamel.yaml import YAML
    from ruamel.yaml.util import load_yaml_guess_indent
    if path.is_symlink():
        raise UsageError(f"{path}: a symbolic link: write the settings into {path.resolve()} yourself")
    text = path.read_text()
    _, indent, dash = load_yaml_guess_indent(text)  # the file's own indentation, kept
    yaml = YAML()  # round-trip mode
    yaml.preserve_quotes = True
    yaml.indent(mapping=indent - dash if dash else indent, sequence=indent, offset=dash)
    doc = yaml.load(text)
    svcs = doc.get("services") if isinstance(doc, dict) else None
    svc = next((s for s in svcs or [] if isinstance(s, dict) and s.get("name") == service), None)
    if svc is None or not isinstance(svc.get("speculative"), dict):
        raise UsageError(f"{path}: defines no service {service!r} with `speculative:`: write the settings where "
                         f"the service is defined")
    spec = svc["speculative"]
    if getattr(spec, "anchor", None) is not None and spec.anchor.value:
        # an anchored mapping is shared by every alias of it: changing it would tune other services too
        raise UsageError(f"{path}: {service}'s `speculative:` is the YAML anchor &{spec.anchor.value}, which other "
                         f"entries may share: write the settings yourself")
    if all(spec.get(k) == v for k, v in values.items()):
        return False
    if dry:
        return True
    for k, v in values.items():
        spec[k] = v
    out = io.StringIO()
    yaml.dump(doc, out)
    put_back(path, out.getvalue())
    return True


def put_back(path: Path, text: str) -> None:
    """Replace the file whole by `text` (a new file renamed over it, its mode kept)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
