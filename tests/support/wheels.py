"""Wheels and a package index on loopback, for the tests of the one reader of a version's files
from its wheel (specops/agent/converge/wheelfiles.py): a small wheel with a RECORD, a PEP 503
index that holds wheels, and a server of it that honours Range or not."""
import functools
import hashlib
import os
import shutil
import threading
import zipfile
from http.server import ThreadingHTTPServer

from sandbox.httprange import Counter, RangeHandler

DEEPSEEK = "sglang/srt/models/deepseek_v2.py"


def serve(root, honour_range=True):
    """root served on a loopback port: (the server, the counter of its requests, its index's URL)."""
    counter = Counter()
    handler = type("H", (RangeHandler,), {"honour_range": honour_range, "counter": counter})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, counter, f"http://127.0.0.1:{server.server_address[1]}/simple"


def index_of(root, *wheels, sha=None):
    """A PEP 503 index under root holding these wheels (linked), each with its #sha256."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    links = []
    for w in wheels:
        dest = root / "files" / w.name
        if not dest.exists():
            os.link(w, dest) if w.stat().st_dev == root.stat().st_dev else shutil.copy(w, dest)
        digest = sha or hashlib.sha256(w.read_bytes()).hexdigest()
        links.append(f'<a href="../../files/{w.name}#sha256={digest}">{w.name}</a>')
    page = root / "simple" / "sglang" / "index.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(links))
    return root


def small_wheel(path, members, record=True):
    """A small wheel with these members and (unless told) a RECORD of their true sha256."""
    import base64
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        lines = []
        for name, data in members.items():
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(data)}")
        if record:
            z.writestr("sglang-9.9.9.dist-info/RECORD", "\n".join(lines) + "\n")
    return path
