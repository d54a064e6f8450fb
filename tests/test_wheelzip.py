"""Hostile wheels and servers against the one reader (wheelzip.py, wheelfiles.py, httpget.py), on
loopback: a bomb whose header lies, broken entries, a RECORD that is missing or silent, a server
that stops honouring Range or refuses a suffix range, entries with no sizes, redirects and links
that would carry credentials elsewhere."""
import base64
import hashlib
import struct
import threading
import tracemalloc
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.error import HTTPError
from urllib.request import Request

import pytest

from specops.agent.converge import wheelfiles
from specops.agent.converge.httpget import SourceError
from support.wheels import DEEPSEEK, index_of, serve, small_wheel

NAME = "sglang-9.9.9-py3-none-any.whl"


def record_line(name, data):
    return f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"


def both(tmp_path, wheel, files=(DEEPSEEK,), match=None):
    """Read the wheel through a server that honours Range and one that does not; each must raise
    SourceError matching `match` (or each answer is returned)."""
    got = []
    for honour in (True, False):
        server, _, url = serve(index_of(tmp_path / f"i{honour}", wheel), honour_range=honour)
        try:
            if match:
                with pytest.raises(SourceError, match=match) as e:
                    wheelfiles.read("sglang", "9.9.9", list(files), [url])
                assert str(e.value).startswith(url[:-len("/simple")] + ": "), e.value  # its scheme and host
            else:
                got.append(wheelfiles.read("sglang", "9.9.9", list(files), [url]))
        finally:
            server.shutdown()
    return got


def _lie_about_size(path, name, size):
    """Rewrite the local and central headers of `name` to claim `size` bytes uncompressed."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    struct.pack_into("<I", data, info.header_offset + 22, size)
    at = data.find(b"PK\x01\x02")
    while data[at + 46:at + 46 + len(name)] != name.encode():  # the central entry of that name
        at = data.find(b"PK\x01\x02", at + 1)
    struct.pack_into("<I", data, at + 24, size)
    path.write_bytes(bytes(data))


def test_a_bomb_whose_header_lies_is_never_inflated_past_what_it_claims(tmp_path):
    wheel = tmp_path / NAME
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(DEEPSEEK, bytes(64 << 20))  # 64 MiB of zeros, about 64 KB deflated
        z.writestr("sglang-9.9.9.dist-info/RECORD", record_line(DEEPSEEK, bytes(64 << 20)))
    _lie_about_size(wheel, DEEPSEEK, 100)
    tracemalloc.start()
    try:
        both(tmp_path, wheel, match=r"its data is not the 100 bytes its entry says|not a readable wheel \(Bad CRC-32")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # the 64 MiB it would inflate to never existed


def test_a_broken_entry_is_a_named_failure_not_a_crash(tmp_path):
    wheel = tmp_path / NAME
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(DEEPSEEK, b"x = 1\n" * 100)
    raw = bytearray(wheel.read_bytes())
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo(DEEPSEEK)
    start = info.header_offset + 30 + len(DEEPSEEK)
    raw[start:start + info.compress_size] = b"\xff" * info.compress_size  # not deflate data
    wheel.write_bytes(bytes(raw))
    both(tmp_path, wheel, match=r"not a readable wheel \(Error -3 while decompressing data")
    (tmp_path / "house").mkdir()
    (tmp_path / "house" / NAME).mkdir()  # a directory where a wheel should be
    with pytest.raises(SourceError, match=r"wheelhouse .*: sglang-9.9.9-py3-none-any.whl: Is a directory"):
        wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], wheelhouse=str(tmp_path / "house"))


def test_a_wheel_without_a_record_or_one_silent_on_the_file_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    bare = small_wheel(tmp_path / "a" / NAME, {DEEPSEEK: b"x = 1\n"}, record=False)
    both(tmp_path / "a", bare, match="the wheel has no RECORD to check its files against")
    (tmp_path / "b").mkdir()
    silent = tmp_path / "b" / NAME
    with zipfile.ZipFile(silent, "w") as z:
        z.writestr(DEEPSEEK, b"x = 1\n")
        z.writestr("sglang-9.9.9.dist-info/RECORD", record_line("sglang/other.py", b"") + "\n")
    both(tmp_path / "b", silent, match=f"the wheel's RECORD gives {DEEPSEEK} no sha256")
    # a file the wheel does not have is None, and needs no RECORD
    assert both(tmp_path / "c", bare, files=["sglang/nope.py"]) == [{"sglang/nope.py": None}] * 2


def test_a_corrupt_entry_in_a_stream_fails_its_crc(tmp_path):
    wheel = tmp_path / NAME
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        z.writestr(DEEPSEEK, b"x = 1\n")
        z.writestr("sglang-9.9.9.dist-info/RECORD", record_line(DEEPSEEK, b"x = 1\n"))
    wheel.write_bytes(wheel.read_bytes().replace(b"x = 1\n", b"x = 2\n", 1))
    both(tmp_path, wheel, match=r"its CRC is not the one its entry gives|not a readable wheel \(Bad CRC-32")


def test_entries_without_sizes_are_refused_when_the_server_ignores_range(tmp_path):
    class Stream:  # a non-seekable target: zipfile writes data descriptors, sizes after the data
        def __init__(self):
            self.data = bytearray()

        def write(self, b):
            self.data += b
            return len(b)

        def flush(self):
            pass
    out = Stream()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(DEEPSEEK, b"x = 1\n")
        z.writestr("sglang-9.9.9.dist-info/RECORD", record_line(DEEPSEEK, b"x = 1\n"))
    wheel = tmp_path / NAME
    wheel.write_bytes(bytes(out.data))
    server, _, url = serve(index_of(tmp_path / "i", wheel), honour_range=False)
    try:
        with pytest.raises(SourceError, match="give no sizes in their headers"):
            wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url])
    finally:
        server.shutdown()
    server, _, url = serve(index_of(tmp_path / "r", wheel), honour_range=True)  # with Range: read as usual
    try:
        assert wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url]) == {DEEPSEEK: b"x = 1\n"}
    finally:
        server.shutdown()


def test_a_server_that_stops_honouring_range_or_refuses_a_suffix(tmp_path, monkeypatch):
    from sandbox.httprange import RangeHandler
    import functools
    import os
    monkeypatch.setattr(wheelfiles, "TAIL", 1024)  # so the member is read by a second range request
    wheel = small_wheel(tmp_path / NAME, {DEEPSEEK: os.urandom(200_000)})
    root = index_of(tmp_path / "i", wheel)
    answers = []

    class Fickle(RangeHandler):
        def send_head(self):
            rng = self.headers.get("Range")
            answers.append(rng)
            if rng and self.server.mode == "refuse-suffix" and rng.startswith("bytes=-"):
                self.send_error(416)
                return None
            if rng and self.server.mode == "stop" and not rng.startswith("bytes=-"):
                del self.headers["Range"]  # answers the whole file, 200
            return super().send_head()
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Fickle, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        server.mode = "stop"
        with pytest.raises(SourceError, match=r"stopped honouring Range \(status 200\)"):
            wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url])
        server.mode = "refuse-suffix"  # 416 to the suffix range: the whole wheel, as a stream
        got = wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url])
        assert len(got[DEEPSEEK]) == 200_000
    finally:
        server.shutdown()


def test_redirects_stay_within_http_and_never_go_down_from_https():
    from specops.agent.converge.httpget import _Redirects
    handler = _Redirects()
    for old, new in (("https://idx/simple/x", "http://idx/files/x.whl"), ("http://idx/simple/x", "file:///etc/shadow"),
                     ("http://idx/simple/x", "ftp://idx/x.whl")):
        with pytest.raises(HTTPError, match="redirect refused"):
            handler.redirect_request(Request(old), None, 302, "Found", {}, new)
    ok = handler.redirect_request(Request("http://idx/simple/x", headers={"Authorization": "Basic x"}), None, 302,
                                  "Found", {}, "https://idx/files/x.whl")
    assert ok.get_header("Authorization") == "Basic x"  # up to https, same host: kept


def test_credentials_are_not_sent_to_a_wheel_linked_on_another_host(tmp_path):
    """The page on 127.0.0.1 links the wheel straight to 127.0.0.2: no Authorization there."""
    wheel = small_wheel(tmp_path / NAME, {DEEPSEEK: b"x = 1\n"})
    seen = []

    class Both(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append((self.server.server_address[0], self.headers.get("Authorization")))
            body = (f'<a href="http://127.0.0.2:{other.server_address[1]}/{NAME}">{NAME}</a>'.encode()
                    if self.path.endswith("/sglang/") else wheel.read_bytes())
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    index, other = ThreadingHTTPServer(("127.0.0.1", 0), Both), ThreadingHTTPServer(("127.0.0.2", 0), Both)
    for server in (index, other):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = wheelfiles.read("sglang", "9.9.9", [DEEPSEEK],
                              [f"http://u:s3cret@127.0.0.1:{index.server_address[1]}/simple"])
    finally:
        index.shutdown()
        other.shutdown()
    assert got == {DEEPSEEK: b"x = 1\n"}
    assert [(host, auth is not None) for host, auth in seen] == [("127.0.0.1", True), ("127.0.0.2", False)]


def test_a_short_range_answer_an_oversized_page_and_an_oversized_record_are_refused(tmp_path, monkeypatch):
    from sandbox.httprange import RangeHandler
    import functools
    import os
    from specops.agent.converge import wheelzip
    monkeypatch.setattr(wheelfiles, "TAIL", 1024)  # the member comes by a second range request
    wheel = small_wheel(tmp_path / NAME, {DEEPSEEK: os.urandom(200_000)})
    root = index_of(tmp_path / "i", wheel)

    class Short(RangeHandler):
        def copyfile(self, source, outputfile):
            rng = self.headers.get("Range")
            if not rng or rng.startswith("bytes=-"):  # the page, and the wheel's tail: whole
                return super().copyfile(source, outputfile)
            self._left -= 10  # says the whole range, sends all but 10 bytes, and closes
            super().copyfile(source, outputfile)
            self.close_connection = True
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Short, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        with pytest.raises(SourceError, match=r"^http://127.0.0.1:\d+: a short range read \(\d+ of \d+ bytes\)"):
            wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url])
    finally:
        server.shutdown()
    monkeypatch.setattr(wheelfiles, "PAGE_MAX", 16)  # a page longer than an index page may be
    server, _, url = serve(root)
    try:
        with pytest.raises(SourceError, match=r"^http://127.0.0.1:\d+: more than 0 MiB"):
            wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url])
    finally:
        server.shutdown()
    monkeypatch.setattr(wheelfiles, "PAGE_MAX", 8 << 20)
    monkeypatch.setattr(wheelzip, "DIRECTORY_MAX", 10)  # a RECORD larger than it may be
    with pytest.raises(SourceError, match=r"RECORD is 0 MiB, more than the 0 MiB"):
        wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], wheelhouse=str(root / "files"))
