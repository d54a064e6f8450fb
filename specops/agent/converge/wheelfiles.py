"""Files of a package version not installed yet, read from its wheel in memory: what a diff patch
will be applied to in a stack that is still to be built, checked before anything moves.

The wheel comes from the host's indexes (PEP 503 pages, in the order uv asks them) or its
wheelhouse directory; nothing is written to disk.  Only when the stack is not built yet: a built
stack's files are read where they are installed (upstream.py)."""
import base64
import hashlib
import io
import os
import re
import zipfile
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit
from urllib.request import Request, urlopen

from specops.agent.converge import stacks
from specops.agent.converge.upstream import record_digest_to_hex
from specops.agent.host import clean

TIMEOUT = 60


def _get(url):
    """GET with the credentials of the URL (if any) as a header, never kept in a log or an error."""
    parts = urlsplit(url)
    headers = {}
    if parts.username:
        token = "%s:%s" % (unquote(parts.username), unquote(parts.password or ""))
        headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
        parts = parts._replace(netloc=parts.hostname + (":%d" % parts.port if parts.port else ""))
    with urlopen(Request(urlunsplit(parts), headers=headers), timeout=TIMEOUT) as res:
        return res.read()


def _wheel_name(dist, version):
    return "%s-%s-" % (re.sub(r"[-_.]+", "_", dist).lower(), version)


def wheel(dist, version, indexes, wheelhouse):
    """The bytes of a wheel of dist==version (the first found), or None."""
    prefix = _wheel_name(dist, version)
    if wheelhouse:
        for n in sorted(os.listdir(wheelhouse)):
            if n.lower().startswith(prefix) and n.endswith(".whl"):
                with open(os.path.join(wheelhouse, n), "rb") as f:
                    return f.read()
        return None
    project = re.sub(r"[-_.]+", "-", dist).lower()
    for index in indexes:
        page = index.rstrip("/") + "/" + project + "/"
        try:
            html = _get(page).decode("utf-8", "replace")
        except OSError:
            continue
        for href in re.findall(r'href="([^"]+)"', html):
            name = unquote(href.split("#")[0].rsplit("/", 1)[-1])
            if name.lower().startswith(prefix) and name.endswith(".whl"):
                data = _get(urljoin(page, href.replace("&amp;", "&")))
                want = re.search(r"#sha256=([0-9a-f]{64})", href)
                if want and hashlib.sha256(data).hexdigest() != want.group(1):
                    raise OSError("%s: not the sha256 the index gives it" % name)
                return data
    return None


def fact(req):
    """Answer a probe's `wheel_files` (see protocol.Probe): {} when the stack is built already."""
    if stacks.stack_of(req["stack"]) is not None:
        return {}
    try:
        data = wheel(req["dist"], req["version"], req.get("indexes") or [], req.get("wheelhouse"))
    except OSError as e:
        return {"error": clean(str(e))[-300:]}
    if data is None:
        return {"error": "no wheel of %s %s in %s" % (req["dist"], req["version"],
                                                      req.get("wheelhouse") or "the package indexes")}
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = set(z.namelist())
        record = next((n for n in names if n.endswith(".dist-info/RECORD")), None)
        digests = {}
        if record:
            for line in z.read(record).decode("utf-8", "replace").splitlines():
                path, _, rest = line.partition(",")
                digests[path] = record_digest_to_hex(rest.split(",")[0])
        for path in req["files"]:
            if path in names:
                content = z.read(path)
                out[path] = {"sha256": digests.get(path) or hashlib.sha256(content).hexdigest(),
                             "content_b64": base64.b64encode(content).decode()}
            else:
                out[path] = None
    return out
