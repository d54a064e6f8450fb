"""The one reader of a version's files from its wheel (specops/agent/converge/wheelfiles.py), on
loopback: the real sglang 0.5.23 wheel read by range requests and as a stream, the deadline
inside every read, a member too large, hashes, and each failure named by its source."""
import socket
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandbox import real_sglang
from specops.agent.converge import wheelfiles
from specops.agent.converge.wheelfiles import SourceError
from support.wheels import DEEPSEEK, index_of, serve, small_wheel


@pytest.fixture(scope="module")
def real_index(tmp_path_factory):
    root = index_of(tmp_path_factory.mktemp("index"), real_sglang.wheel("0.5.23"), real_sglang.wheel("0.5.21"))
    return root


def test_range_reads_move_under_5_mb_for_one_file_of_the_real_wheel(real_index):
    server, counter, url = serve(real_index)
    try:
        stats = {}
        got = wheelfiles.read("sglang", "0.5.23", [DEEPSEEK, "sglang/nope.py"], [url], stats=stats)
    finally:
        server.shutdown()
    assert got[DEEPSEEK].decode() == real_sglang.file_of("0.5.23", "srt/models/deepseek_v2.py")
    assert got["sglang/nope.py"] is None
    wheel_size = real_sglang.wheel("0.5.23").stat().st_size
    assert wheel_size > 30 << 20
    wheel_bytes = sum(n for path, rng, n in counter.requests if path.endswith(".whl"))
    assert all(rng for path, rng, n in counter.requests if path.endswith(".whl"))  # every GET of it a range
    assert counter.sent < 5_000_000 and wheel_bytes == stats["moved"], (counter.sent, stats)
    print(f"BENCH range read of {DEEPSEEK}: {counter.sent} bytes moved of a {wheel_size}-byte wheel")


def test_a_server_that_ignores_range_is_read_as_a_stream_with_its_hash_checked(real_index, tmp_path):
    server, counter, url = serve(real_index, honour_range=False)
    try:
        got = wheelfiles.read("sglang", "0.5.23", [DEEPSEEK], [url])
        assert got[DEEPSEEK].decode() == real_sglang.file_of("0.5.23", "srt/models/deepseek_v2.py")
        bad = index_of(tmp_path / "bad", real_sglang.wheel("0.5.23"), sha="0" * 64)
        server2, _, url2 = serve(bad, honour_range=False)
        try:
            with pytest.raises(SourceError, match="hash mismatch: the wheel is not the sha256 the index gives it"):
                wheelfiles.read("sglang", "0.5.23", [DEEPSEEK], [url2])
        finally:
            server2.shutdown()
    finally:
        server.shutdown()


def test_a_member_not_the_records_sha256_is_refused(tmp_path):
    wheel = small_wheel(tmp_path / "sglang-9.9.9-py3-none-any.whl", {DEEPSEEK: b"x = 1\n"})
    # the member's bytes changed after the RECORD was written: rewrite the zip with other bytes
    with zipfile.ZipFile(wheel) as z:
        record = z.read("sglang-9.9.9.dist-info/RECORD")
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(DEEPSEEK, b"x = 2\n")
        z.writestr("sglang-9.9.9.dist-info/RECORD", record)
    for honour in (True, False):
        server, _, url = serve(index_of(tmp_path / f"i{honour}", wheel), honour_range=honour)
        try:
            with pytest.raises(SourceError, match=f"hash mismatch: {DEEPSEEK} is not what the wheel's RECORD says"):
                wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url])
        finally:
            server.shutdown()
    with pytest.raises(SourceError, match="hash mismatch"):
        wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], wheelhouse=str(tmp_path / "iTrue" / "files"))


def test_a_200_mib_member_is_refused_before_it_is_read(tmp_path):
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open(DEEPSEEK, "w", force_zip64=True) as f:  # 200 MiB of zeros, about 200 KB deflated
            block = bytes(1 << 20)
            for _ in range(200):
                f.write(block)
    server, counter, url = serve(index_of(tmp_path / "index", wheel))
    try:
        with pytest.raises(SourceError, match=r"is 200 MiB, more than the 32 MiB"):
            wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url])
    finally:
        server.shutdown()
    # only the tail moved (its central directory): never the member's data, at the wheel's start
    assert [rng for path, rng, _ in counter.requests if path.endswith(".whl")] == [f"bytes=-{wheelfiles.TAIL}"]


class _Trickle(BaseHTTPRequestHandler):
    """Answers a page at once, then the wheel's answer one byte every 2 s, its status line first
    (http.client reads a header line in one call: only a deadline inside the reads ends it)."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path.endswith("/sglang/"):
            body = b'<a href="../../files/sglang-9.9.9-py3-none-any.whl">sglang-9.9.9-py3-none-any.whl</a>'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        try:
            for byte in b"HTTP/1.1 200 OK " + b"x" * 60:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(2)
        except OSError:
            pass


def test_an_index_that_trickles_fails_at_the_deadline_not_later():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(SourceError, match="timed out after 5s"):
            wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [f"http://127.0.0.1:{server.server_address[1]}/simple"],
                            timeout=5)
        took = time.monotonic() - t0
    finally:
        server.shutdown()
    assert 4.5 < took < 6.5, took


def test_each_failure_names_its_source_and_why_and_only_a_404_moves_on(tmp_path):
    """uv's choice of index: the first that has the project is the one; an index without it (404)
    sends the read on, any other failure ends it, named."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
    refused = f"http://user:s3cret@127.0.0.1:{dead.getsockname()[1]}/simple"
    asked = []

    class Auth(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            asked.append(self.path)
            self.send_response(401 if "private" in self.path else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Auth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    wheel = small_wheel(tmp_path / "sglang-0.5.21-py3-none-any.whl", {DEEPSEEK: b"x = 1\n"})
    listed, _, has = serve(index_of(tmp_path / "index", wheel))
    port = server.server_address[1]
    private, missing = f"http://127.0.0.1:{port}/private", f"http://127.0.0.1:{port}/simple"

    def said(*indexes):
        with pytest.raises(SourceError) as e:
            wheelfiles.read("sglang", "0.5.22", [DEEPSEEK], list(indexes))
        return str(e.value)
    try:
        assert said(refused, has) == f"http://127.0.0.1:{dead.getsockname()[1]}: unreachable " \
                                     f"(Connection refused)"  # its credentials not said; the next not asked
        host, other = f"http://127.0.0.1:{port}", has[:-len("/simple")]  # an index said by scheme and host alone
        assert said(private, has) == f"{host}: 401 Unauthorized (its credentials?)"
        assert said(missing, has, private) == f"{host}: 404 Not Found (no such project there); " \
                                              f"{other}: no sglang 0.5.22 there (it has 0.5.21)"
        assert asked == ["/private/sglang/", "/simple/sglang/"]  # the index after the one with the project: never
    finally:
        server.shutdown()
        listed.shutdown()
        dead.close()
    with pytest.raises(SourceError, match=r"wheelhouse .*: no sglang 0.5.22 \(it has 0.5.21\)"):
        wheelfiles.read("sglang", "0.5.22", [DEEPSEEK], wheelhouse=str(tmp_path / "index" / "files"))
    with pytest.raises(SourceError, match="no wheelhouse and no package index"):
        wheelfiles.read("sglang", "0.5.22", [DEEPSEEK], [])


def test_a_wheelhouse_is_read_in_place_and_no_index_is_asked(tmp_path, monkeypatch):
    from specops.sglang import stack
    wheel = real_sglang.wheel("0.5.23")
    host = {"wheelhouse": str(wheel.parent), "sglang": {"version": "0.5.23"}, "torch": {"version": "2.9.1"}}
    assert stack.wheel_request(host, [DEEPSEEK]) == {}  # nothing for the host to fetch
    monkeypatch.setattr(wheelfiles, "from_index", lambda *a, **k: pytest.fail("an index was asked"))
    got = stack.wheel_files(host, [DEEPSEEK], {})
    assert got[DEEPSEEK].decode() == real_sglang.file_of("0.5.23", "srt/models/deepseek_v2.py")
    # no wheelhouse: the indexes the stack is built from, the public one only as uv's default
    bare = {"sglang": {"version": "0.5.23"}, "torch": {"version": "2.9.1"}}
    assert stack.wheel_request(bare, [DEEPSEEK])["indexes"] == [stack.PYPI]
    named = dict(bare, package_index="http://mirror.example/simple")
    assert stack.wheel_request(named, [DEEPSEEK])["indexes"] == ["http://mirror.example/simple"]


def test_memory_stays_bounded_by_the_member_when_streaming(real_index):
    """The stream parser holds the member, not the wheel: peak traced allocation far below the
    39 MB wheel."""
    import tracemalloc
    server, _, url = serve(real_index, honour_range=False)
    tracemalloc.start()
    try:
        wheelfiles.read("sglang", "0.5.23", [DEEPSEEK], [url])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        server.shutdown()
    assert peak < 8 << 20, peak


def test_credentials_never_go_in_clear_from_an_https_index(tmp_path):
    """An https index's credentials are not sent to an http link on its host (the scheme counts)."""
    from specops.agent.converge.httpget import Client, Watch
    seen = []

    class Record(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    netloc = f"127.0.0.1:{server.server_address[1]}"
    watch = Watch(10)
    try:
        for index in (f"https://user:s3cret@{netloc}/simple", f"http://user:s3cret@{netloc}/simple"):
            Client(index, watch).open(f"http://{netloc}/files/x.whl").close()
    finally:
        watch.close()
        server.shutdown()
    assert seen[0] is None and seen[1] is not None, seen  # from the https index: none; the http one's own: yes


def test_a_page_linking_another_scheme_is_not_followed(tmp_path):
    """file:, ftp:, data: links on a hostile page: root reads no local file, and says why."""
    root = tmp_path / "index"
    (root / "simple" / "sglang").mkdir(parents=True)
    (tmp_path / "secret").write_text("root only")
    name = "sglang-9.9.9-py3-none-any.whl"
    for link in (f"file://{tmp_path}/secret#{name}", f"data:,x#{name}"):
        (root / "simple" / "sglang" / "index.html").write_text(
            f'<a href="{link.replace("#" + name, "")}/{name}">{name}</a>')
        server, counter, url = serve(root)
        try:
            with pytest.raises(SourceError, match=r"only http\(s\) is followed"):
                wheelfiles.read("sglang", "9.9.9", [DEEPSEEK], [url])
        finally:
            server.shutdown()


def test_what_one_answer_holds_is_bounded_across_its_files(tmp_path):
    """Each file under 32 MiB, three of them over the 64 MiB one answer may carry: refused."""
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    names = [f"sglang/big{i}.py" for i in range(3)]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for n in names:
            with z.open(n, "w") as f:
                for _ in range(30):
                    f.write(bytes(1 << 20))
    for honour in (True, False):
        server, _, url = serve(index_of(tmp_path / f"i{honour}", wheel), honour_range=honour)
        try:
            with pytest.raises(SourceError, match="more than 64 MiB together"):
                wheelfiles.read("sglang", "9.9.9", names, [url])
        finally:
            server.shutdown()
