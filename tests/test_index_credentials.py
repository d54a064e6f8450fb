"""An index URL's credentials (`package_index`, `extra_index`, `torch.index_url`): sent only to the
index's own host:port, never to a host a redirect or a link names; scrubbed from text however many
`@` the password holds; never in the agent's errors, which name an index by scheme and host alone;
hidden by the redactor; a URL a password tore refused at load; and root's own pip variables that
name a source never reach pip beside them."""
import json
import os
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specops.agent.converge import installs
from specops.agent.converge.httpget import Client, Watch, scrub


def test_a_redirect_to_another_host_carries_no_credentials():
    """The index answers 302 to another port of its own address and to another address: urllib
    copies the Authorization header to wherever a redirect goes, and neither may get it, nor a
    link to the other port.  A redirect within the index's host:port keeps it."""
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
        client.open(f"http://127.0.0.1:{other.server_address[1]}/link").close()  # as a page's link names it
    finally:
        watch.close()
        for server in (index, other, far):
            server.shutdown()
    got = {(server.server_address, path): auth is not None for server in (index, other, far)
           for address, path, auth in seen if address == server.server_address}
    assert got == {(index.server_address, "/simple/port/"): True, (other.server_address, "/x"): False,
                   (other.server_address, "/link"): False,
                   (index.server_address, "/simple/address/"): True, (far.server_address, "/x"): False,
                   (index.server_address, "/simple/same/"): True, (index.server_address, "/y"): True}, seen


@pytest.mark.parametrize("text,want", [
    ("https://user:p@ss@host/x", "https://host/x"),
    ("from https://__token__:p@ss@w@rd@ix.example:8443/simple: 401", "from https://ix.example:8443/simple: 401"),
    ("at https://tok:se/cret@ix.example/x: 401", "at https://ix.example/x: 401"),  # a / ? or # in it too
    ("at http://tok:se?cr#et@ix.example/x", "at http://ix.example/x"),
])
def test_scrub_takes_a_password_out_whole_whatever_it_holds_but_a_space(text, want):
    assert scrub(text) == want


# pip reads each of its long options from PIP_<NAME> (an alias too: --pypi-url is --index-url).
ROOTS_OWN = {"PIP_INDEX_URL": "http://roots-own/simple", "PIP_EXTRA_INDEX_URL": "http://roots-own/extra",
             "PIP_FIND_LINKS": "http://roots-own/links", "PIP_TRUSTED_HOST": "roots-own", "PIP_NO_INDEX": "1",
             "PIP_PYPI_URL": "http://roots-own/pypi", "PIP_REQUIREMENT": "/roots-own/requirements.txt",
             "PIP_CONSTRAINT": "/roots-own/constraints.txt", "PIP_EDITABLE": "git+https://roots-own/x",
             "PIP_TARGET": "/roots-own/target", "PIP_PREFIX": "/roots-own", "PIP_ROOT": "/roots-own", "PIP_USER": "1"}


@pytest.mark.parametrize("name", sorted(ROOTS_OWN))
def test_roots_own_pip_source_variables_never_reach_pip(name, monkeypatch):
    """Each alone in root's environment: pip is given only the sources specops names, an index or
    a wheelhouse (an index, a requirement or a link the inventory never named would be installed
    from), and root's other pip settings (a CA) stay."""
    for other in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(other)
    monkeypatch.setenv(name, ROOTS_OWN[name])
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/private-ca.pem")
    index = "https://ix.example/simple"
    for sources, named in ((["--index-url", index], {"PIP_INDEX_URL": index}),
                           (["--no-index", "--find-links", "/wh"], {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wh"})):
        env = installs.pip_env(sources)
        pips = {k: v for k, v in env.items() if k.startswith("PIP_")}
        assert pips == {**named, "PIP_CERT": "/etc/ssl/private-ca.pem"}


PIP_SEES = ("from pip._internal.commands import create_command; import json; o, _ = create_command('install')"
            ".parse_args(['x']); print(json.dumps(dict(index=o.index_url, extra=o.extra_index_urls, "
            "links=o.find_links, trusted=o.trusted_hosts, requirements=o.requirements, constraints=o.constraints, "
            "editables=o.editables, target=o.target_dir, prefix=o.prefix_path, root=o.root_path, no_index=o.no_index, "
            "user=o.use_user_site)))")


def test_the_real_pip_reads_roots_variables_and_its_config_but_pip_env_passes_it_the_config(tmp_path, monkeypatch):
    """The suite's own pip, as `pip install` sees its options: each of ROOTS_OWN is read from the
    environment (so pip_env must drop it), and a config file's extra index is read as well."""
    import subprocess
    import sys
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url = http://from-conf/simple\n")
    for other in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(other)
    for name, value in ROOTS_OWN.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))

    def seen(env):
        res = subprocess.run([sys.executable, "-c", PIP_SEES], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)
    roots = seen(dict(os.environ))
    flags = ("no_index", "user")
    assert all("roots-own" in json.dumps(roots[k]) for k in roots if k not in flags) and all(map(roots.get, flags))
    got = seen(installs.pip_env(["--index-url", "https://ix.example/simple"]))
    assert "roots-own" not in json.dumps(got) and not any(map(got.get, flags)), got
    assert got["index"] == "https://ix.example/simple" and got["extra"] == ["http://from-conf/simple"], got


# Passwords holding / ? # or a space, not percent-encoded: each cuts the URL short, and what is
# left of the userinfo is read as the host and a port (issue 49's reproduction is the first).
TORN = ["https://tok:se/cret@{at}/simple", "https://tok:4242/cret@{at}/simple", "http://tok:se?cret@{at}/simple",
        "http://tok:se#cret@{at}/simple", "http://tok:se cret@{at}/simple", "https://tok:se\\cret@{at}/simple"]


@pytest.mark.parametrize("torn", TORN)
def test_an_index_url_a_password_tore_is_never_said_by_the_agent(torn, monkeypatch):
    """The agent's answer to the patch check (it reaches the terminal and the JSON report) says
    which index failed without a part of its user or password."""
    from specops.agent.converge import stacks, wheelfiles
    monkeypatch.setattr(stacks, "stack_of", lambda name: None)
    got = wheelfiles.fact({"stack": "x", "dist": "sglang", "version": "9.9.9", "files": ["a.py"], "timeout": 5,
                           "indexes": [torn.format(at="127.0.0.1:9")]})
    error = got["error"]
    assert "tok" not in error and "cret" not in error and "4242" not in error, error
    assert not re.search(r"\bse\b", error), error
    assert error.startswith("index 1 of 1: its URL does not parse"), error


def test_an_index_that_fails_is_named_by_its_scheme_and_host_alone():
    """Its user, its password and its path (a token may be any of them) are not said."""
    from specops.agent.converge import wheelfiles
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
    at = f"127.0.0.1:{dead.getsockname()[1]}"
    try:
        for index in (f"http://user:s3cret@{at}/t0ken/simple", f"http://T0KEN-only@{at}/t0ken/simple"):
            with pytest.raises(wheelfiles.SourceError) as e:
                wheelfiles.read("sglang", "9.9.9", ["a.py"], [index], timeout=5)
            assert str(e.value) == f"http://{at}: unreachable (Connection refused)"
    finally:
        dead.close()


INDEXES = {"package_index": "https://u:se%2Fcret@ix.example/simple", "extra_index": "https://T0KEN-only@ix.example/x",
           "torch": {"version": "2.9.1", "index_url": "https://u:p@ss-w0rd@ix.example/whl/{variant}"}}


def test_the_redactor_hides_index_passwords_wherever_they_appear_in_output(tmp_path):
    """A password as the URL writes it and as it decodes, and a token given as the user alone: in
    a line, the recap and the JSON report, in their escaped forms too."""
    import io
    import json
    from specops.inventory import Host
    from specops.output.report import HostReport, Redactor, Reporter, recap
    said = ["se%2Fcret", "se/cret", "T0KEN-only", "p@ss-w0rd"]
    stream = io.StringIO()
    out = Reporter(Redactor([Host("h", INDEXES)]), show_diff=False, stream=stream)
    out.line("h", "pip said: " + " ".join(said))
    report = HostReport("h", error=json.dumps(said), notes=said)
    recap([report], out, str(tmp_path / "r.json"))
    for secret in said:
        assert secret not in stream.getvalue() and secret not in (tmp_path / "r.json").read_text(), secret
    assert "pip said: *** *** *** ***" in stream.getvalue()
    assert Redactor([Host("h", {"package_index": "https://__token__:pypi-AgEx@ix.example/simple"})])(
        "https://__token__:pypi-AgEx@ix.example/simple") == "https://__token__:***@ix.example/simple"


def test_an_index_url_that_does_not_parse_is_refused_at_load_naming_its_key_not_its_text(tmp_path):
    from specops import inventory
    from specops.errors import UsageError
    from roles import VOCABULARY

    def load(**host):
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": host}}}))
        return inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts["box"]
    for url in ("https://u:se%2Fcret@ix.example/simple", "http://10.0.0.1:8080/simple", "https://u:p@ss@ix.example/",
                "http://[::1]:3141/simple", "https://T0KEN@pypi.fury.io/me/", "HTTPS://ix.example/simple"):
        assert load(package_index=url, extra_index=url)["package_index"] == url
    assert load(torch={"version": "2.9.1", "index_url": "https://download.pytorch.org/whl/{variant}"})
    for torn in [*TORN, "ix.example/simple", "ftp://ix.example/simple", "http:///simple", "http://ix:port/",
                 "http://[::1/simple", "file:///srv/index"]:
        url = torn.format(at="ix.example")
        for key, where in (("package_index", "package_index"), ("extra_index", "extra_index"),
                           ("torch", "torch.index_url")):
            value = {"version": "2.9.1", "index_url": url} if key == "torch" else url
            with pytest.raises(UsageError) as e:
                load(**{key: value})
            msg = str(e.value)
            assert "\n" not in msg and f"all.hosts.box.{where}: an index URL is http(s)://" in msg, msg
            assert "tok" not in msg and "cret" not in msg and "ix.example" not in msg, msg


def test_inv_deploy_with_a_torn_index_url_is_one_usage_line_without_it(tmp_path):
    """Exit 2 before connecting; stderr names the file and key, nothing of the URL."""
    from support.site import Sandbox
    (tmp_path / "hosts.yml").write_text(json.dumps(
        {"all": {"hosts": {"box": {"package_index": "https://tok:se/cret@ix.example/simple"}}}}))
    res = Sandbox(None, tmp_path).inv("deploy", "--all", inventory=tmp_path, timeout=60)
    assert res.returncode == 2 and res.stdout == "", res
    assert res.stderr.count("\n") == 1 and "all.hosts.box.package_index: an index URL is" in res.stderr, res.stderr
    assert not re.search(r"tok|\bse\b|cret|ix\.example", res.stderr), res.stderr


def test_a_value_of_the_wrong_type_is_not_echoed_when_it_may_hold_credentials(tmp_path):
    """torch: as a URL string, not a mapping: the refusal says the type, not the token (the review
    of issue 49 saw it printed whole); a plain value is still shown, as a hint."""
    from specops import inventory
    from specops.errors import UsageError
    from roles import VOCABULARY
    for torch, shown in (("https://__token__:pypi-S3cretT0ken@ix.example/whl/{variant}", "S3cret"), ("2.9.1", "2.9.1")):
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {"torch": torch}}}}))
        with pytest.raises(UsageError) as e:
            inventory.load(tmp_path / "hosts.yml", VOCABULARY)
        assert "must be a mapping, not a string" in str(e.value) and (shown in str(e.value)) is (shown == torch)
