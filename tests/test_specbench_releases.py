"""Releases and their figures (specops/output/releases.py, the agent's perf.json): two releases
compared beside their speed, and said to be measured with different loads when they were; the
listing into a pipe and on a terminal; each service's perf.json kept, also a release's its gate
refused.  No fleet."""
import json

import pytest

from specops import protocol
from support.perf import speed


def test_two_releases_are_compared_beside_their_speed():
    from specops.output.releases import compare
    old = {"spec": {"sglang": {"speculative_num_steps": 3, "tp_size": 1}}, "packages": {"sglang": "0.5.22"},
           "files": {"/opt/p/qwen3.py": "aa", "/etc/u": "bb"}, "perf": {"sglang": speed(100.0, accept=3.0)}}
    new = {"spec": {"sglang": {"speculative_num_steps": 5, "tp_size": 1}}, "packages": {"sglang": "0.5.23"},
           "files": {"/opt/p/qwen3.py": "cc", "/etc/u": "bb"},
           "perf": {"sglang": speed(80.0, accept=2.909090909090909)}}
    assert compare(old, new) == ["sglang speculative_num_steps: 3 -> 5", "package sglang: 0.5.22 -> 0.5.23",
                                 "file /opt/p/qwen3.py: changed",
                                 "sglang tok/s @1: 100.0 -> 80.0, accept length 3.00 -> 2.91"]


def test_releases_into_a_pipe_are_whole_lines_and_on_a_terminal_cut_between_words():
    """Issue 24 (a new user's rough edge): `inv releases` cut every summary at 70 characters, in the
    middle of a figure ("... (245.3 to").  Not on a terminal, lines are whole; on one, a summary is
    shortened to the terminal's width after a whole word, and says so."""
    from specops.output.releases import lines
    why = ("sglang: gate: speedup 0.61x at concurrency 1 (245.3 tok/s with speculation, 402.7 without) "
           "is below min_speedup 1.0")
    releases = [{"stamp": "20261203T150000Z", "status": "deployed", "current": True, "services": ["sglang"],
                 "summary": "/etc/systemd/system/sglang.service"},
                {"stamp": "20261203T160000Z", "status": "rolled-back", "current": False, "services": ["sglang"],
                 "summary": why}]
    whole = lines("t4", releases)
    assert whole[1].startswith("t4             20261203T160000Z  rolled-back sglang  ") and whole[1].endswith(why)
    cut = lines("t4", releases, 100)
    assert cut[0] == whole[0] and len(cut[1]) <= 100 and cut[1].endswith(" …"), cut
    kept = cut[1][len("t4             20261203T160000Z  rolled-back sglang  "):-2]
    assert why.startswith(kept) and why[len(kept)] == " " and len(kept) > 20, kept  # a whole word ends there


def test_perf_json_keeps_each_service_and_reads_the_old_single_service_file(tmp_path, monkeypatch):
    from specops.agent import releases
    monkeypatch.setattr(releases, "RELEASES", str(tmp_path))
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1/manifest.json").write_text("{}")
    (tmp_path / "r1/perf.json").write_text(json.dumps(speed(50.0)))
    assert set(releases.read_perf("r1")) == {"sglang"}
    releases.record_perf(protocol.PerfRecord(perf={**speed(70.0), "service": "small"}, stamp="r1"))
    releases.record_perf(protocol.PerfRecord(perf=speed(60.0), stamp="r1"))
    got = releases.read_perf("r1")
    assert {k: v["spec"][0]["figures"]["output_tok_s"] for k, v in got.items()} == {"sglang": 60.0, "small": 70.0}


def test_a_release_its_gate_refused_keeps_what_the_gate_measured(tmp_path, monkeypatch):
    """Issue 24 (a new user's rough edge): the report showed "-" for a release `deploy --bench` had
    measured and then rolled back: the gate's figures were never written.  Now undo keeps them
    in that release's perf.json (the agent's own record and listing, on a temporary directory),
    and the page shows them, marked rolled back."""
    from types import SimpleNamespace
    from specops import inventory
    from specops.agent import releases
    from specops.errors import GateFailed, SpecopsError
    from specops.flows import pipeline
    from specops.output import perfpage
    monkeypatch.setattr(releases, "RELEASES", str(tmp_path))
    stamp, sent = "20261204T090000Z", []

    class Run:
        host, quick, applied, report = inventory.Host("t1", {}), (), ["a change"], SimpleNamespace(notes=[])
        kept, running, restarting, applying, concerned = [], None, True, False, frozenset()
        opts = SimpleNamespace(provenance=None)

        def previous(self):
            return {}

        def enabled(self):
            return []

        def say(self, text):
            pass

        def call(self, req, **kw):
            sent.append(type(req).__name__)
            if isinstance(req, protocol.Undo):  # the first deploy: nothing earlier to verify
                return protocol.UndoResult(restored=[], current=None)
            return {"ReleaseRecord": releases.record, "PerfRecord": releases.record_perf}[type(req).__name__](req)

    measured = {**speed(54.8, 90.0), "at": "2026-12-04T09:05:00Z", "verdict": "speculative decoding: 0.61x"}
    with pytest.raises(SpecopsError, match="below min_speedup 1.0; rolled back"):
        pipeline.undo(Run(), f"/var/lib/specops/releases/{stamp}",
                      GateFailed("sglang: gate: speedup 0.61x is below min_speedup 1.0", [measured]))
    assert sent == ["Undo", "ReleaseRecord", "PerfRecord"]
    (listed,) = releases.releases(protocol.Releases()).releases
    assert listed["status"] == "rolled-back" and listed["perf"]["sglang"]["spec"] == measured["spec"]
    text = perfpage.service_section("t1", "sglang", [listed], {"min_speedup": 1.0})
    assert "<td data-rolled-back>speculative decoding: 0.61x (measured, then rolled back)</td>" in text
    assert f"release {stamp}, rolled back)</h3>" in text and 'data-speedup="0.609"' in text


def test_releases_measured_with_different_loads_are_said_to_be_so():
    """Issue 24: `inv releases` compared accept length across releases measured with different
    loads without saying so; and a rolled-back release is compared by its figures only."""
    from specops.output.releases import compare, since
    load = {"concurrency": [1], "requests": 12, "max_new_tokens": 48, "seed": 0}
    old = {"stamp": "r1", "status": "deployed", "spec": {"sglang": {"tp_size": 1}},
           "perf": {"sglang": {**speed(100.0, accept=3.0), "load": load}}}
    new = {"stamp": "r2", "status": "deployed", "spec": {"sglang": {"tp_size": 1}},
           "perf": {"sglang": {**speed(80.0, accept=2.1), "load": dict(load, max_new_tokens=128)}}}
    assert compare(old, new) == ["sglang measured with different loads, not like for like: max_new_tokens 48 -> 128",
                                 "sglang tok/s @1: 100.0 -> 80.0, accept length 3.00 -> 2.10"]
    assert compare(old, dict(new, perf=old["perf"]))[0].startswith("sglang tok/s @1")  # the same load: nothing said
    undone = {"stamp": "r3", "status": "rolled-back",  # its manifest: no spec, packages or files
              "perf": {"sglang": {**speed(54.8, accept=1.2), "load": dict(load, max_new_tokens=128)}}}
    assert since([old, new, undone], undone) == ("r2", ["sglang tok/s @1: 80.0 -> 54.8, accept length 2.10 -> 1.20"])
    assert since([old, undone, dict(new, stamp="r4")], dict(new, stamp="r4"))[0] == "r1"  # not the rolled-back one
