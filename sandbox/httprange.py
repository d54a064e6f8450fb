"""A static file handler that honours HTTP range requests as real package indexes' file hosts do
(`Range: bytes=A-B`, `bytes=A-`, `bytes=-N` → 206 with Content-Range), and counts the bytes it
sends, so a test can say how much of a wheel a read moved.  Python's SimpleHTTPRequestHandler
ignores Range; with `honour_range` False this one does too (a server of that kind)."""
from __future__ import annotations

import os
import re
import threading
from http.server import SimpleHTTPRequestHandler

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class Counter:
    """Bytes sent by every handler sharing it."""

    def __init__(self):
        self.sent, self.requests, self._lock = 0, [], threading.Lock()

    def add(self, path: str, n: int, rng: str | None) -> None:
        with self._lock:
            self.sent += n
            self.requests.append((path, rng, n))


class RangeHandler(SimpleHTTPRequestHandler):
    honour_range = True
    counter: Counter | None = None

    def log_message(self, *args):
        pass

    def send_head(self):
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        m = _RANGE.match(rng or "")
        if not (self.honour_range and m and os.path.isfile(path)):
            return super().send_head()
        size = os.path.getsize(path)
        first, last = m.groups()
        if first:
            start, end = int(first), min(size - 1, int(last) if last else size - 1)
        else:
            start, end = max(0, size - int(last or 0)), size - 1
        if start > end:
            self.send_error(416)
            return None
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self._left = end - start + 1
        return f

    def copyfile(self, source, outputfile):
        left, sent = getattr(self, "_left", None), 0
        while left is None or left > 0:
            chunk = source.read(65536 if left is None else min(65536, left))
            if not chunk:
                break
            outputfile.write(chunk)
            sent += len(chunk)
            if left is not None:
                left -= len(chunk)
        if self.counter is not None:
            self.counter.add(self.path, sent, self.headers.get("Range"))
