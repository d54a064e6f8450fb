"""The agent's probe of a patched file and its upstream (converge.probe, converge.upstream), on
files of the test's own.  No fleet."""
import base64
import hashlib

import pytest

from specops import protocol
from specops.agent.converge import probe, upstream, venvs

KEY = "pkg:/opt/v:sglang/srt/models/llama.py"
UPSTREAM = b"MODEL_CODE = 'upstream'\n" * 1000
PATCHED = UPSTREAM.replace(b"upstream", b"patched")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A venv's sglang whose RECORD gives UPSTREAM's sha256, a kept copy of it, and every path
    upstream.read_file was asked for."""
    site = tmp_path / "site"
    (site / "sglang/srt/models").mkdir(parents=True)
    (site / "sglang-0.5.23.dist-info").mkdir()
    digest = hashlib.sha256(UPSTREAM).digest()
    (site / "sglang-0.5.23.dist-info/RECORD").write_text(
        "sglang/srt/models/llama.py,sha256=%s,%d\n" % (base64.urlsafe_b64encode(digest).decode().rstrip("="),
                                                     len(UPSTREAM)))
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / digest.hex()).write_bytes(UPSTREAM)
    monkeypatch.setattr(upstream, "UPSTREAM_DIR", str(tmp_path / "kept"))
    fact = {"exists": True, "dirs": {"sglang": str(site / "sglang")}, "packages": {"sglang": "0.5.23"}}
    monkeypatch.setattr(venvs, "venv_fact", lambda venv: dict(fact))
    reads = []
    real = upstream.read_file
    monkeypatch.setattr(upstream, "read_file", lambda path, *a: reads.append(path) or real(path, *a))
    return site / "sglang/srt/models/llama.py", reads


def test_a_patched_file_is_read_once_its_upstream_from_the_kept_copy(host):
    """A no-op's case: the probe hashed the installed file already; it is not the upstream one,
    so the upstream fact reads only the kept copy (it read and hashed the file a second time)."""
    installed, reads = host
    installed.write_bytes(PATCHED)
    got = probe.probe(protocol.Probe(files=[KEY], upstream=[KEY], content={KEY: "0" * 64}))
    assert got.files[KEY]["sha256"] == hashlib.sha256(PATCHED).hexdigest()
    assert got.upstream[KEY]["kept"] is True
    assert base64.b64decode(got.upstream[KEY]["content_b64"]) == UPSTREAM
    assert str(installed) not in reads


def test_an_unpatched_file_is_its_own_upstream(host):
    installed, reads = host
    installed.write_bytes(UPSTREAM)
    got = probe.probe(protocol.Probe(files=[KEY], upstream=[KEY], content={KEY: "0" * 64}))
    assert base64.b64decode(got.upstream[KEY]["content_b64"]) == UPSTREAM
    assert got.upstream[KEY]["sha256"] == got.files[KEY]["sha256"]
    alone = probe.probe(protocol.Probe(upstream=[KEY]))  # no file fact to go by: read as before
    assert base64.b64decode(alone.upstream[KEY]["content_b64"]) == UPSTREAM and str(installed) in reads
