"""An index URL's credentials (`package_index`, `extra_index`, `torch.index_url`): sent only to the
index's own host:port, never to a host a redirect names; scrubbed from text however many `@` the
password holds; and root's own pip variables that name a source never reach pip beside them."""
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specops.agent.converge import installs
from specops.agent.converge.httpget import Client, Watch, scrub


def test_a_redirect_to_another_host_carries_no_credentials():
    """The index answers 302 to another port of its own address and to another address: urllib
    copies the Authorization header to wherever a redirect goes, and neither may get it.  A
    redirect within the index's host:port keeps it."""
    seen = []

    class Redirecting(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append((self.server.server_address, self.path, self.headers.get("Authorization")))
            to = {"/simple/port/": f"http://127.0.0.1:{other.server_address[1]}/x",
                  "/simple/address/": f"http://127.0.0.2:{far.server_address[1]}/x",
                  "/simple/same/": "/y"}.get(self.path)
            self.send_response(302 if to else 200)
            if to:
                self.send_header("Location", to)
            self.send_header("Content-Length", "0")
            self.end_headers()
    index, other, far = (ThreadingHTTPServer((address, 0), Redirecting)
                         for address in ("127.0.0.1", "127.0.0.1", "127.0.0.2"))
    for server in (index, other, far):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    netloc, watch = f"127.0.0.1:{index.server_address[1]}", Watch(10)
    try:
        client = Client(f"http://u:s3cret@{netloc}/simple", watch)
        for path in ("port", "address", "same"):
            client.open(f"http://{netloc}/simple/{path}/").close()
    finally:
        watch.close()
        for server in (index, other, far):
            server.shutdown()
    got = {(server.server_address, path): auth is not None for server in (index, other, far)
           for address, path, auth in seen if address == server.server_address}
    assert got == {(index.server_address, "/simple/port/"): True, (other.server_address, "/x"): False,
                   (index.server_address, "/simple/address/"): True, (far.server_address, "/x"): False,
                   (index.server_address, "/simple/same/"): True, (index.server_address, "/y"): True}, seen


@pytest.mark.parametrize("text,want", [
    ("https://user:p@ss@host/x", "https://host/x"),
    ("from https://__token__:p@ss@w@rd@ix.example:8443/simple: 401", "from https://ix.example:8443/simple: 401"),
])
def test_scrub_takes_a_password_out_whole_however_many_at_signs_it_holds(text, want):
    assert scrub(text) == want


# pip reads each of its long options from PIP_<NAME> (an alias too: --pypi-url is --index-url).
ROOTS_OWN = {"PIP_INDEX_URL": "http://roots-own/simple", "PIP_EXTRA_INDEX_URL": "http://roots-own/extra",
             "PIP_FIND_LINKS": "http://roots-own/links", "PIP_TRUSTED_HOST": "roots-own", "PIP_NO_INDEX": "1",
             "PIP_PYPI_URL": "http://roots-own/pypi", "PIP_REQUIREMENT": "/roots-own/requirements.txt",
             "PIP_CONSTRAINT": "/roots-own/constraints.txt", "PIP_EDITABLE": "git+https://roots-own/x"}


@pytest.mark.parametrize("name", sorted(ROOTS_OWN))
def test_roots_own_pip_source_variables_never_reach_pip(name, monkeypatch):
    """Each alone in root's environment: pip is given only the sources specops names, an index or
    a wheelhouse (an index, a requirement or a link the inventory never named would be installed
    from), and root's other pip settings (a CA) stay."""
    for other in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(other)
    monkeypatch.setenv(name, ROOTS_OWN[name])
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/private-ca.pem")
    for sources, named in ((["--index-url", "https://ix.example/simple"], {"PIP_INDEX_URL": "https://ix.example/simple"}),
                           (["--no-index", "--find-links", "/wh"], {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wh"})):
        env = installs.pip_env(sources)
        assert {k: v for k, v in env.items() if k.startswith("PIP_")} == {**named, "PIP_CERT": "/etc/ssl/private-ca.pem"}
