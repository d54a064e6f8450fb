"""The gate in front of the sandbox's olah (see sandbox/hub.py for why): Range, gated repos, cuts.

    python -m sandbox.hubgate ADDRESS PORT OLAH_PORT HUB_DIR
"""
from __future__ import annotations

import http.client
import json
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sandbox.hub import ESCAPE, GATED, TOKEN

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "server", "date"}
RESOLVE = re.compile(r"^/(?:api/models/)?([^/]+/[^/]+)/(?:resolve|revision|tree|paths-info)/")


def main(address: str, port: int, olah: str, hub: Path) -> None:
    served = [0]

    class Gate(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            sys.stderr.write("gate: " + (fmt % args) + "\n")

        def do_HEAD(self):
            self._forward(body=False)

        def do_GET(self):
            self._forward(body=True)

        def _forward(self, body: bool) -> None:
            m = RESOLVE.match(self.path)
            if m and m.group(1) in GATED and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                message = (
                    f"Access to model {m.group(1)} is restricted. You must have access to it and be authenticated."
                )
                self.send_response(401)
                self.send_header("X-Error-Code", "GatedRepo")
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                data = ('{"error": "%s"}' % message).encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)
                return
            if "/resolve/" in self.path and (hub / "cut-done").exists():  # the link is down until uncut()
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            _hold(hub, self.path)
            evil = self.path.startswith(f"/api/models/{ESCAPE}/")
            if evil:  # a hostile listing: the target's, plus a name that climbs out of the directory
                self.path = self.path.replace(ESCAPE, "sandbox/tiny-llama", 1)
            conn = http.client.HTTPConnection(olah, timeout=60)
            # Host kept: olah builds its redirects from it, and they must point back here.
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("range", "accept-encoding")}
            conn.request(self.command, self.path, headers=headers)
            res = conn.getresponse()
            data = res.read() if body else b""
            if evil and res.status == 200:
                listing = json.loads(data)
                listing["siblings"].append({"rfilename": "../../etc/specops-escape.json"})
                data = json.dumps(listing).encode()
            size = len(data) if evil else int(res.getheader("Content-Length") or len(data))
            start = _range_start(self.headers.get("Range")) if res.status == 200 and "/resolve/" in self.path else 0
            status = 206 if start else res.status
            self.send_response(status)
            for k, v in res.getheaders():
                if k.lower() not in HOP:
                    self.send_header(k, v)
            if "/resolve/" in self.path:
                self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.send_header("Content-Length", str(size - start))
            self.end_headers()
            if not body:
                return
            payload = data[start:]
            cut = hub / "cut"
            if "/resolve/" in self.path and len(payload) > 1 << 20 and cut.exists():
                cut.rename(hub / "cut-done")
                payload = payload[:len(payload) // 2]  # then the connection drops mid-file
                self.close_connection = True
            rate = _rate(hub) if "/resolve/" in self.path else 0
            step = max(rate // 10, 1) if rate else max(len(payload), 1)
            for at in range(0, len(payload), step):  # slowed: a tenth of the rate every 0.1 s
                self.wfile.write(payload[at:at + step])
                if rate:
                    time.sleep(0.1)
            if "/resolve/" in self.path:
                served[0] += len(payload)
                (hub / "served").write_text(str(served[0]))

    ThreadingHTTPServer((address, port), Gate).serve_forever()


def _hold(hub: Path, path: str) -> None:
    """A listing of the held repository waits until the test releases it (at most 5 minutes)."""
    try:
        repo = (hub / "hold").read_text()
    except OSError:
        return
    if not path.startswith(f"/api/models/{repo}/revision/"):
        return
    (hub / "held").write_text(path)
    deadline = time.monotonic() + 300
    while (hub / "hold").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _rate(hub: Path) -> int:
    try:
        return int((hub / "slow").read_text())
    except (OSError, ValueError):
        return 0


def _range_start(header: str | None) -> int:
    m = re.match(r"^bytes=(\d+)-$", header or "")
    return int(m.group(1)) if m else 0


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
