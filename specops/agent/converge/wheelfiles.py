"""Files of a package version that is not installed, read from its wheel without installing it or
writing a byte: what a diff patch will be applied to in a stack still to be built, checked before
anything moves, and what `inv patch` edits and rebases onto.

The one reader, on both sides: the controller reads its own wheelhouse with it (a wheel file),
the agent the host's package indexes (PEP 503 pages), as uv picks one: the first index that has
the project is the one used, whether or not it has the version.  From an index the wheel is read
with HTTP range requests: the zip's tail and central directory, then each wanted member (about
1.7 MB moved for one file of the 39 MB SGLang 0.5.23 wheel).  A server that ignores `Range` is
read as one stream instead, its members parsed as they pass (wheelzip.py): memory stays bounded
by the members wanted, never the wheel.  One deadline holds the whole read, inside every socket
read too (httpget.py).  Each member is checked against the sha256 the wheel's RECORD gives it,
and a streamed wheel against the index's `#sha256`.  A range read trusts the index (its TLS) for
the wheel, as pip and uv do for the page that names it: the whole wheel's sha256 cannot be known
without reading all of it.
"""
import base64
import hashlib
import html
import os
import re
from http.client import HTTPException
from urllib.error import HTTPError
from urllib.parse import unquote, urljoin

from specops.agent.converge import wheelzip
from specops.agent.converge.indexurl import origin
from specops.agent.converge.httpget import (
    Client,
    SourceError,
    Watch,
    scrub,
    why,
)  # noqa: F401 (SourceError: for callers)

FAILURES = (OSError, ValueError, HTTPException) + wheelzip.BROKEN  # a fetch that failed, however

TIMEOUT = 60            # seconds a whole read may take (a trickle too)
PAGE_MAX = 8 << 20      # bytes an index page may have
TAIL = 256 << 10        # bytes asked first from a wheel's end: its central directory, most often


def normalized(dist, sep="_"):
    """A distribution's name as wheel files (sep "_") and index pages (sep "-") spell it."""
    return re.sub(r"[-_.]+", sep, dist).lower()


def _wheel_prefix(dist, version):
    return "%s-%s-" % (normalized(dist), version)


def _versions(names, dist):
    norm = normalized(dist) + "-"
    return sorted({n[len(norm):].split("-")[0] for n in names if n.lower().startswith(norm)},
                  key=lambda v: [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+]", v)])


def from_wheelhouse(dist, version, files, wheelhouse):
    """{path: bytes or None} from dist==version's wheel in a wheelhouse directory."""
    prefix = _wheel_prefix(dist, version)
    try:
        names = sorted(n for n in os.listdir(wheelhouse) if n.endswith(".whl"))
    except OSError as e:
        raise SourceError("wheelhouse %s: %s" % (wheelhouse, e.strerror))
    wheel = next((n for n in names if n.lower().startswith(prefix)), None)
    if wheel is None:
        has = _versions(names, dist)
        raise SourceError("wheelhouse %s: no %s %s%s" % (wheelhouse, dist, version,
                                                         " (it has %s)" % ", ".join(has) if has else ""))
    try:
        with open(os.path.join(wheelhouse, wheel), "rb") as f:
            return wheelzip.from_zip(f, files)
    except SourceError as e:
        raise SourceError("wheelhouse %s: %s: %s" % (wheelhouse, wheel, e))
    except OSError as e:
        raise SourceError("wheelhouse %s: %s: %s" % (wheelhouse, wheel, e.strerror or e))


def from_index(dist, version, files, index, watch, stats=None):
    """{path: bytes or None} from dist==version's wheel on a PEP 503 index.  `stats` (a dict)
    gets the bytes moved."""
    client = Client(index, watch)
    project = normalized(dist, "-")
    with client.open(index.rstrip("/") + "/" + project + "/") as res:
        page, base = client.read_all(res, PAGE_MAX), res.geturl()
    links = []
    for href in re.findall(r"""href=["']([^"']+)["']""", page.decode("utf-8", "replace")):
        href = html.unescape(href)
        links.append((unquote(href.split("#")[0].rsplit("/", 1)[-1]), href))
    prefix = _wheel_prefix(dist, version)
    match = [(n, h) for n, h in links if n.lower().startswith(prefix) and n.endswith(".whl")]
    if not match:
        has = _versions([n for n, _ in links if n.endswith(".whl")], dist)
        raise SourceError("no %s %s there%s" % (dist, version, " (it has %s)" % ", ".join(has[-8:]) if has else ""))
    name, href = match[0]
    want = re.search(r"#sha256=([0-9a-fA-F]{64})", href)
    url = urljoin(base, href)
    try:
        res = client.open(url, {"Range": "bytes=-%d" % TAIL})
    except HTTPError as e:
        if e.code not in (416, 501):
            raise
        res = client.open(url)  # a server that refuses a suffix range: the whole wheel, as a stream
    with res:
        if res.status == 206:
            total = re.search(r"/(\d+)\s*$", res.headers.get("Content-Range") or "")
            if not total:
                raise SourceError("%s: a range answer without the wheel's size" % name)
            tail = client.read_all(res, TAIL)
            size = int(total.group(1))
            remote = wheelzip.RangeFile(client, url, size, tail, size - len(tail))
            out = wheelzip.from_zip(remote, files)
            moved = remote.moved
        elif res.status == 200:
            out = wheelzip.from_stream(lambda n: client.read(res, n), files, want and want.group(1))
            moved = None
        else:
            raise SourceError("%s: status %d" % (name, res.status))
    if stats is not None:
        stats["moved"] = moved
        stats["wheel"] = name
    return out


def read(dist, version, files, indexes=(), wheelhouse=None, timeout=TIMEOUT, stats=None):
    """{path: bytes or None (not in the wheel)} of dist==version: from the wheelhouse when one is
    given (and no index then), else from the first index that has the project (uv's choice: an
    index without it, 404, sends the read on to the next).  SourceError names every source tried
    (an index by its scheme and host alone) and why it failed, in one line."""
    if wheelhouse:
        return from_wheelhouse(dist, version, files, wheelhouse)
    if not indexes:
        raise SourceError("no wheelhouse and no package index to read %s %s from" % (dist, version))
    watch, failed = Watch(timeout), []
    try:
        for i, index in enumerate(indexes):
            if origin(index) is None:  # nothing of it said: what would pass for its host is a password's start
                failed.append("index %d of %d: its URL does not parse (a password's / ? # and spaces are written "
                              "%%2F %%3F %%23 %%20)" % (i + 1, len(indexes)))
                break
            try:
                return from_index(dist, version, files, index, watch, stats)
            except FAILURES + (SourceError,) as e:
                failed.append("%s: %s" % (origin(index), scrub(why(e, watch))))
                if not (isinstance(e, HTTPError) and e.code == 404):
                    break  # only an index without the project sends uv on to the next
    finally:
        watch.close()
    raise SourceError(re.sub(r"\s+", " ", "; ".join(failed)))  # one line, whatever a page named


def fact(req):
    """Answer a probe's `wheel_files` (see protocol.Probe): {} when the stack is built already."""
    from specops.agent.converge import stacks
    from specops.agent.host import clean
    if stacks.stack_of(req["stack"]) is not None:
        return {}
    try:
        got = read(req["dist"], req["version"], req["files"], req.get("indexes") or [],
                   timeout=req.get("timeout") or TIMEOUT)
    except (SourceError,) + FAILURES as e:
        return {"error": clean(scrub(str(e)))[-600:]}
    return {path: None if data is None else {"sha256": hashlib.sha256(data).hexdigest(),
                                             "content_b64": base64.b64encode(data).decode()}
            for path, data in got.items()}
