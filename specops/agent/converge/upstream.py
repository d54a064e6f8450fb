"""The upstream file a patch applies to: what a package's wheel installed at a path (its RECORD
says the sha256), and that content, from the file itself while it is unpatched, else from the
copy kept in layout.UPSTREAM_DIR when it was first patched."""
import binascii
import os

from specops.agent.converge.venvs import resolve_key
from specops.agent import safefs
from specops.agent.host import ActionError, sha256
from specops.agent.safefs import UnsafePath, read_file
from specops.agent.stagedir import StageDir
from specops.layout import UPSTREAM_DIR, split_pkg_key


def record_sha256(site, package, version, inner):
    """The hex sha256 the package's RECORD gives <package>/<inner> (None: not listed)."""
    norm = normalized(package)
    try:
        names = os.listdir(site)
    except OSError:
        return None
    for n in names:
        if not n.endswith(".dist-info") or normalized(n[:-10].rpartition("-")[0]) != norm:
            continue
        if version and n[:-10].rpartition("-")[2] != version:
            continue
        try:
            with open(os.path.join(site, n, "RECORD")) as f:
                for line in f:
                    path, _, rest = line.rstrip("\n").partition(",")
                    if path == "%s/%s" % (package, inner):
                        return record_digest_to_hex(rest.split(",")[0])
        except OSError:
            return None
    return None


def normalized(name):
    """A distribution's name as wheels compare them: each run of - _ . one _, lower case; what
    re.sub(r"[-_.]+", "_", name).lower() gives, without importing re on every probe."""
    name = name.replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name.lower()


def record_digest_to_hex(field):
    """A wheel RECORD hash ("sha256=<urlsafe base64, no padding>") as hex; None for another
    algorithm, an empty field or a malformed digest."""
    algo, _, digest = (field or "").partition("=")
    if algo != "sha256" or not digest:
        return None
    try:
        # base64.urlsafe_b64decode's: the urlsafe alphabet's two letters as the standard one's
        raw = binascii.a2b_base64((digest + "=" * (-len(digest) % 4)).replace("-", "+").replace("_", "/"))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def _content(path, want):
    try:
        data = read_file(path)
    except UnsafePath:
        return None
    return data if data is not None and sha256(data).hexdigest() == want else None


def _installed(path, want, seen):
    """The installed file's content when it is the upstream one (sha256 `want`).  A file the
    same probe hashed already (`seen`, at this path) is read again only when its hash is `want`:
    its bytes are sent then; a patched file, every no-op's case, is not read twice."""
    if seen and seen.get("path") == path and seen.get("sha256") and seen["sha256"] != want:
        return None
    return _content(path, want)


def fact(key, venvs, allowed=(), seen=None):
    """Answer one key of a probe's `upstream` (see protocol.ProbeResult).  `seen`: the same
    probe's file fact for this key (probe.file_fact), whose sha256 spares reading and hashing
    the installed file a second time when it is not the upstream one (a patched file)."""
    path = resolve_key(key, venvs)
    venv, package, inner = split_pkg_key(key)
    v = venvs.get(venv) or {}
    version = (v.get("packages") or {}).get(package)
    base = (v.get("dirs") or {}).get(package)
    if path is None or base is None:
        return {"path": None, "version": version, "sha256": None, "content_b64": None}
    want = record_sha256(os.path.dirname(base), package, version, inner)
    data = kept = None
    if want:
        kept = _content(os.path.join(UPSTREAM_DIR, want), want)
        data = _installed(path, want, seen) or kept
    return {"path": path, "version": version, "sha256": want, "kept": kept is not None,
            "content_b64": binascii.b2a_base64(data, newline=False).decode() if data is not None else None}


def keep(a, allowed=()):
    """Answer a protocol.KeepUpstream (see there)."""
    data = binascii.a2b_base64(a.data)  # base64.b64decode's
    if sha256(data).hexdigest() != a.sha256 or len(a.sha256) != 64:
        raise ActionError("the upstream copy does not have the sha256 %s it is named by" % a.sha256)
    path = os.path.join(UPSTREAM_DIR, a.sha256)
    if _content(path, a.sha256) is None:
        safefs.make_dir(UPSTREAM_DIR, 0o755, 0, 0)
        stage = StageDir(path)
        try:
            stage.write(data, 0o644, 0, 0)
            stage.commit()
        except BaseException:
            stage.remove()
            raise
