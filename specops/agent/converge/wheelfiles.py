"""Files of a package version not installed yet, read from its wheel in memory: what a diff patch
will be applied to in a stack that is still to be built, checked before anything moves.

The wheel comes from the host's indexes (PEP 503 pages, in the order uv asks them) or its
wheelhouse directory; nothing is written to disk.  Only when the stack is not built yet: a built
stack's files are read where they are installed (upstream.py)."""
import base64
import hashlib
import html
import io
import os
import re
import time
import zipfile
from http.client import HTTPException
from urllib.error import HTTPError
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit
from urllib.request import HTTPRedirectHandler, Request, build_opener

from specops.agent.converge import stacks
from specops.agent.host import clean

FAILURES = (OSError, ValueError, HTTPException, zipfile.BadZipFile)  # a fetch that failed, however

TIMEOUT = 60          # seconds a whole fetch may take (a slow trickle too)
PAGE_MAX = 8 << 20    # bytes an index page may have
WHEEL_MAX = 512 << 20  # bytes a wheel may have, and a file in it
_USERINFO = re.compile(r"//[^/@\s]*@")


class _Redirects(HTTPRedirectHandler):
    """Redirects within http(s) only, never from https down to http, and the credentials kept
    for the host they were given for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old, new = urlsplit(req.full_url), urlsplit(newurl)
        if new.scheme not in ("http", "https") or (old.scheme, new.scheme) == ("https", "http"):
            raise HTTPError(_USERINFO.sub("//", newurl), code, "redirect refused", headers, fp)
        out = HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)
        if out is not None and new.netloc.rpartition("@")[2] != old.netloc.rpartition("@")[2]:
            out.remove_header("Authorization")
        return out


_OPENER = build_opener(_Redirects)


def _auth(url):
    """(host[:port], Authorization header) of an index URL with credentials, else None."""
    parts = urlsplit(url)
    if not parts.username:
        return None
    token = "%s:%s" % (unquote(parts.username), unquote(parts.password or ""))
    return parts.netloc.rpartition("@")[2], "Basic " + base64.b64encode(token.encode()).decode()


def _get(url, limit, deadline, auth=None):
    """(body, final URL) of a GET, with the index's credentials (`auth`) when it goes to the
    index's own host; at most `limit` bytes, by `deadline`."""
    parts = urlsplit(url)
    parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    headers = {"Authorization": auth[1]} if auth and parts.netloc == auth[0] else {}
    chunks, size = [], 0
    with _OPENER.open(Request(urlunsplit(parts), headers=headers), timeout=TIMEOUT) as res:
        while True:
            if time.time() > deadline:
                raise OSError("timed out after %ds" % TIMEOUT)
            chunk = res.read(1 << 20)
            if not chunk:
                return b"".join(chunks), res.geturl()
            size += len(chunk)
            if size > limit:
                raise OSError("more than %d MiB" % (limit >> 20))
            chunks.append(chunk)


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
    deadline = time.time() + TIMEOUT
    for index in indexes:
        auth = _auth(index)
        try:
            page, base = _get(index.rstrip("/") + "/" + project + "/", PAGE_MAX, deadline, auth)
        except FAILURES:
            continue
        for href in re.findall(r"""href=["']([^"']+)["']""", page.decode("utf-8", "replace")):
            href = html.unescape(href)
            name = unquote(href.split("#")[0].rsplit("/", 1)[-1])
            if name.lower().startswith(prefix) and name.endswith(".whl"):
                data, _ = _get(urljoin(base, href), WHEEL_MAX, deadline, auth)
                want = re.search(r"#sha256=([0-9a-fA-F]{64})", href)
                if want and hashlib.sha256(data).hexdigest() != want.group(1).lower():
                    raise OSError("%s: not the sha256 the index gives it" % name)
                return data
    return None


def fact(req):
    """Answer a probe's `wheel_files` (see protocol.Probe): {} when the stack is built already."""
    if stacks.stack_of(req["stack"]) is not None:
        return {}
    try:
        data = wheel(req["dist"], req["version"], req.get("indexes") or [], req.get("wheelhouse"))
    except FAILURES as e:
        return {"error": clean(_USERINFO.sub("//", str(e)))[-300:]}
    if data is None:
        return {"error": "no wheel of %s %s in %s" % (req["dist"], req["version"],
                                                      req.get("wheelhouse") or "the package indexes")}
    out = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for path in req["files"]:
                try:
                    info = z.getinfo(path)
                except KeyError:
                    out[path] = None
                    continue
                if info.file_size > WHEEL_MAX:
                    return {"error": "%s: %s is too large" % (req["dist"], path)}
                content = z.read(info)  # its sha256 is its own: the wheel's RECORD is not trusted
                out[path] = {"sha256": hashlib.sha256(content).hexdigest(),
                             "content_b64": base64.b64encode(content).decode()}
    except zipfile.BadZipFile as e:
        return {"error": "%s %s: not a wheel (%s)" % (req["dist"], req["version"], e)}
    return out
