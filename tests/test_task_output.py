"""What the listing tasks print, and in which order: the table first and the recap last, as
deploy ends with its recap (status, releases).  The hosts' runs are stood in for (no fleet)."""
import io
import sys

import pytest
from invoke import Context

import tasks
from specops import cli, protocol
from specops.flows import status as status_mod
from specops.output.report import HostReport


@pytest.fixture
def one_host(tmp_path):
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    t1: {address: 192.0.2.1}\n")
    return str(tmp_path)


def _ran(result, monkeypatch) -> io.StringIO:
    """Each host's run returns `result`; stdout and stderr go to one stream, as a terminal shows
    them (set in the test itself: pytest's capture replaces them again after the fixtures)."""
    monkeypatch.setattr(cli, "run_hosts", lambda hosts, body, roles, opts, out: [
        HostReport(h.name, result=result, elapsed=0.1) for h in hosts])
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", out)
    return out


def test_releases_prints_its_listing_before_the_recap(one_host, monkeypatch):
    out = _ran(protocol.ReleasesResult(current="20260101T000000.000000Z", releases=[
        {"stamp": "20260101T000000.000000Z", "status": "deployed", "services": ["sglang"], "current": True,
         "summary": "unit sglang"}]), monkeypatch)
    tasks.releases(Context(), host="t1", inventory=one_host)
    text = out.getvalue()
    assert "20260101T000000.000000Z" in text and "RECAP" in text, text
    assert text.index("20260101T000000.000000Z") < text.index("RECAP"), text


def test_status_prints_its_table_before_the_recap(one_host, monkeypatch):
    out = _ran({"services": []}, monkeypatch)
    monkeypatch.setattr(status_mod, "table", lambda results: "HOST  SERVICE  (the table)")
    tasks.status(Context(), host="t1", inventory=one_host)
    text = out.getvalue()
    assert text.index("(the table)") < text.index("RECAP"), text
