"""GETs under one deadline that holds inside every socket read (a watchdog shuts the sockets
when it passes, so a server that trickles a byte at a time cannot hold a read past it), with
redirects kept within http(s), never down from https to http, and an index's credentials sent
only to its own host.  A failure said in a few words (`why`).  Used by wheelfiles.py."""
import base64
import re
import socket
import threading
import time
from http.client import HTTPConnection, HTTPSConnection
from urllib.error import HTTPError, URLError
from urllib.parse import unquote, urlsplit, urlunsplit
from urllib.request import HTTPHandler, HTTPRedirectHandler, HTTPSHandler, Request, build_opener

TIMEOUT = 60  # seconds, when the caller gives none
_USERINFO = re.compile(r"//\S*@")  # to the last @ before a space: a password may hold @ / ? #


class SourceError(Exception):
    """One source (an index, a wheelhouse) that could not give what was asked: str() says which
    and why."""


def scrub(text):
    """Text with every URL's user:password@ taken out (a URL torn by a password's space is
    refused before it is read: indexurl.py)."""
    return _USERINFO.sub("//", text)


class Watch(object):
    """One deadline for a whole read.  Every socket opened under it is shut when it passes, so a
    server that trickles a byte at a time cannot hold a read past it."""

    def __init__(self, seconds):
        self.seconds, self.at = seconds, time.monotonic() + seconds
        self.expired, self._socks, self._lock = False, [], threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self):
        left = self.at - time.monotonic()
        if self.expired or left <= 0:
            raise SourceError("timed out after %gs" % self.seconds)
        return left

    def add(self, sock):
        with self._lock:
            self._socks.append(sock)
            if self.expired:
                self._shut(sock)

    def _expire(self):
        with self._lock:
            self.expired = True
            for sock in self._socks:
                self._shut(sock)

    @staticmethod
    def _shut(sock):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self):
        self._timer.cancel()


def _watched(base, watch):
    class Connection(base):
        def connect(self):
            self.timeout = min(self.timeout or TIMEOUT, watch.left())  # the connect itself too
            base.connect(self)
            watch.add(self.sock)
    return Connection


class _HTTP(HTTPHandler):
    def __init__(self, watch):
        HTTPHandler.__init__(self)
        self.watch = watch

    def http_open(self, req):
        return self.do_open(_watched(HTTPConnection, self.watch), req)


class _HTTPS(HTTPSHandler):
    def __init__(self, watch):
        HTTPSHandler.__init__(self)
        self.watch = watch

    def https_open(self, req):
        return self.do_open(_watched(HTTPSConnection, self.watch), req, context=self._context)


class _Redirects(HTTPRedirectHandler):
    """Redirects within http(s) only, never from https down to http, and the credentials kept
    for the host they were given for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old, new = urlsplit(req.full_url), urlsplit(newurl)
        if new.scheme not in ("http", "https") or (old.scheme, new.scheme) == ("https", "http"):
            raise HTTPError(scrub(newurl), code, "redirect refused", headers, fp)
        out = HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)
        if out is not None and new.netloc.rpartition("@")[2] != old.netloc.rpartition("@")[2]:
            out.remove_header("Authorization")
        return out


class Client(object):
    """GETs to one index under one deadline, its credentials sent only to its own host."""

    def __init__(self, index, watch):
        self.watch = watch
        self.opener = build_opener(_Redirects, _HTTP(watch), _HTTPS(watch))
        parts = urlsplit(index)
        self.auth = None
        if parts.username:
            token = "%s:%s" % (unquote(parts.username), unquote(parts.password or ""))
            self.auth = (parts.scheme, parts.netloc.rpartition("@")[2],
                         "Basic " + base64.b64encode(token.encode()).decode())

    def open(self, url, headers=None):
        """A GET of an http(s) URL (a page may link anything: file:, ftp:, data: are refused)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise SourceError("a link to %s: only http(s) is followed" % (parts.scheme or "a relative path"))
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
        headers = dict(headers or {})
        # The credentials go to the index's own host, and never in clear from an https index.
        if self.auth and parts.netloc == self.auth[1] and parts.scheme in (self.auth[0], "https"):
            headers["Authorization"] = self.auth[2]
        return self.opener.open(Request(urlunsplit(parts), headers=headers), timeout=self.watch.left())

    def read(self, res, n):
        """Up to n bytes as soon as some arrive (b"" at the end), within the deadline."""
        self.watch.left()
        return res.read1(n) if hasattr(res, "read1") else res.read(min(n, 1 << 16))

    def read_all(self, res, limit):
        chunks, size = [], 0
        while True:
            chunk = self.read(res, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise SourceError("more than %d MiB" % (limit >> 20))
            chunks.append(chunk)


def why(e, watch):
    if watch.expired:
        return "timed out after %gs" % watch.seconds
    if isinstance(e, HTTPError):
        hint = {401: " (its credentials?)", 403: " (its credentials?)", 404: " (no such project there)"}
        return "%d %s%s" % (e.code, e.reason, hint.get(e.code, ""))
    if isinstance(e, URLError):
        reason = e.reason
        return "unreachable (%s)" % (getattr(reason, "strerror", None) or reason)
    if isinstance(e, ConnectionRefusedError):
        return "unreachable (connection refused)"
    if isinstance(e, socket.timeout):
        return "timed out after %gs" % watch.seconds
    return str(e) or type(e).__name__


