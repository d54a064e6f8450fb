"""Releases on the host without the fleet (specops/agent/releases.py, rollback.py) and how they are
listed (specops/output/releases.py, the report's table): a release `inv rollback` left behind is
shown rolled back, not "deployed" (issue 38)."""
import json
import os

import pytest

from specops import protocol
from specops.agent import releases, rollback
from specops.agent.converge import stacks
from specops.output import perfpage
from specops.output.releases import lines

STAMPS = ("20260101T000000.000000Z", "20260102T000000.000000Z", "20260103T000000.000000Z")


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Three deployed releases, the newest current; the agent's directories in the test's own."""
    rel = tmp_path / "releases"
    rel.mkdir(mode=0o700)
    (tmp_path / "venvs").mkdir()
    for module in (releases, rollback):
        monkeypatch.setattr(module, "RELEASES", str(rel))
    monkeypatch.setattr(stacks, "STACKS_DIR", str(tmp_path / "venvs"))
    monkeypatch.setattr(rollback, "_restart", lambda *a, **k: None)  # no systemd here
    for stamp in STAMPS:
        (rel / stamp).mkdir()
        (rel / stamp / "manifest.json").write_text(json.dumps({
            "stamp": stamp, "status": "deployed", "services": ["sglang"], "files": {}, "previous": {},
            "summary": "unit sglang"}))
    os.symlink(STAMPS[-1], rel / "current")
    return rel


def listed():
    return {r["stamp"]: r for r in releases.releases(protocol.Releases()).releases}


def test_what_a_rollback_leaves_is_listed_rolled_back_until_it_is_current_again(host):
    first, second, third = STAMPS
    rollback.rollback(protocol.Rollback(to=first))
    now = listed()
    assert now[first]["current"] and now[first]["rolled_back"] is None
    assert now[second]["rolled_back"]["to"] == first and now[third]["rolled_back"]["to"] == first
    assert now[third]["status"] == "deployed"  # a later rollback still reads what it replaced
    text = "\n".join(lines("t1", list(now.values())))
    assert f"t1             {third}  rolled-back sglang  unit sglang\n{'':<14} rolled back to {first}" in text, text
    assert f"t1           * {first}  deployed    sglang" in text, text
    page = perfpage.service_section("t1", "sglang", list(now.values()), None)
    assert f'<tr data-stamp="{third}"><td>{third}</td><td>rolled-back</td>' in page
    assert f'<tr data-stamp="{first}"><td>{first} (current)</td><td>deployed</td>' in page
    # back to the newest: it runs again, and is no longer marked; the one between stays rolled back
    rollback.rollback(protocol.Rollback(to=third))
    now = listed()
    assert now[third]["rolled_back"] is None and now[second]["rolled_back"]["to"] == first
    assert "rolled back to" not in lines("t1", [now[third]])[0]


def test_a_release_left_before_rollbacks_marked_it_is_known_by_being_newer_than_current(host):
    os.unlink(host / "current")
    os.symlink(STAMPS[0], host / "current")  # a rollback by an older specops: no mark written
    now = listed()
    assert now[STAMPS[2]]["rolled_back"] == {"to": STAMPS[0]} and now[STAMPS[0]]["rolled_back"] is None
    assert protocol.is_rolled_back(now[STAMPS[2]]) and not protocol.is_rolled_back(now[STAMPS[0]])


def test_a_release_names_its_stack_by_the_versions_it_moved_not_its_hash():
    """Issue 38: the listing and the report said "stack /opt/specops/venvs/2c1f…" where a person
    wants "sglang 0.5.23 → 0.5.24"."""
    from specops.output.releases import stack_lines
    old, new = {"sglang": "0.5.23", "torch": "2.9.1"}, {"sglang": "0.5.24", "torch": "2.9.1"}
    listed = [{"stamp": STAMPS[0], "status": "deployed", "current": False, "services": ["sglang"],
               "summary": "stack /opt/specops/venvs/aaaa", "packages": old},
              {"stamp": STAMPS[1], "status": "rolled-back", "current": False, "services": ["sglang"],
               "summary": "verify failed"},  # an undone deploy records no packages: compared past it
              {"stamp": STAMPS[2], "status": "deployed", "current": True, "services": ["sglang"],
               "summary": "stack /opt/specops/venvs/bbbb", "packages": new}]
    text = lines("t1", listed)
    assert text[-1] == f"{'':<14} stack: sglang 0.5.23 → 0.5.24" and sum("stack:" in line for line in text) == 1, text
    page = perfpage.service_section("t1", "sglang", listed, None)
    assert "<td data-stack>sglang 0.5.23, torch 2.9.1</td>" in page and "<td data-stack>-</td>" in page
    assert "<td data-stack>sglang 0.5.23 → 0.5.24, torch 2.9.1</td>" in page
    assert "/opt/specops/venvs/b  sglang 0.5.24, torch 2.9.1  " in stack_lines("t1", [
        {"path": "/opt/specops/venvs/b", "packages": new, "bytes": 0, "new": 0, "releases": [STAMPS[2]]}])[1]


def test_a_rollback_that_happened_is_not_failed_by_its_listing_mark(host, monkeypatch):
    def broken(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(rollback, "mark_rolled_back", broken)
    res = rollback.rollback(protocol.Rollback(to=STAMPS[0]))
    assert res.to == STAMPS[0] and listed()[STAMPS[0]]["current"]
    assert res.notes == ["the releases left behind are not marked rolled back: No space left on device"]


WHO = {"user": "alice", "controller": "laptop", "checkout": "3f2a9c1d4e5f6a7b" + "0" * 24 + "+dirty",
       "inventory": "9e8d7c6b1a2b3c4d" + "0" * 24}


def test_who_deployed_a_release_is_kept_listed_and_shown_and_an_older_release_shows_nothing(host, tmp_path):
    """Issue 46: the record's provenance goes into the manifest (what is not known left out) and the
    listing; `inv releases` says it in a line, --json holds it; the releases before it say nothing."""
    stamp = "20260104T000000.000000Z"
    who = protocol.Provenance(user="alice", controller="laptop", checkout=WHO["checkout"])  # no inventory repo
    releases.record(protocol.ReleaseRecord(stamp=stamp, managed=[], previous={}, manifest={"services": ["sglang"],
                                                                                           "summary": "unit sglang"},
                                           provenance=who))
    assert json.loads((host / stamp / "manifest.json").read_text())["provenance"] == {
        "user": "alice", "controller": "laptop", "checkout": WHO["checkout"]}
    now = listed()
    assert now[stamp]["provenance"]["user"] == "alice" and now[STAMPS[0]]["provenance"] is None
    text = lines("t1", [now[STAMPS[0]], now[stamp]])
    assert text == [f"t1             {STAMPS[0]}  deployed    sglang  unit sglang",
                    f"t1           * {stamp}  deployed    sglang  unit sglang",
                    f"{'':<14} by alice@laptop, specops 3f2a9c1d4e5f+dirty"]
    full = dict(now[stamp], provenance=WHO)
    assert lines("t1", [full])[1] == f"{'':<14} by alice@laptop, specops 3f2a9c1d4e5f+dirty, inventory 9e8d7c6b1a2b"
    # --json: the report holds the releases as the host listed them
    import io
    from types import SimpleNamespace
    from specops.flows import pipeline
    from specops.inventory import Host
    from specops.output.report import HostReport, Redactor, Reporter, recap
    run = SimpleNamespace(report=HostReport("t1"), call=lambda req, **kw: releases.releases(req))
    pipeline.releases(run)
    path = tmp_path / "r.json"
    recap([run.report], Reporter(Redactor([Host("t1", {})]), show_diff=False, stream=io.StringIO()), str(path))
    got = {r["stamp"]: r for r in json.loads(path.read_text())["hosts"]["t1"]["releases"]["releases"]}
    assert got[stamp]["provenance"] == {"user": "alice", "controller": "laptop", "checkout": WHO["checkout"]}
    assert got[STAMPS[0]]["provenance"] is None
    import tasks
    assert "json" in {a.name for a in tasks.releases.get_arguments()}  # inv releases --json PATH


def test_the_report_says_who_deployed_each_release_escaped_and_unknown_before_it_was_recorded():
    from support.perfpage import MARKUP, checked_page
    listed = [{"stamp": STAMPS[0], "status": "deployed", "summary": "s"},
              {"stamp": STAMPS[1], "status": "deployed", "current": True, "summary": "s",
               "provenance": dict(WHO, user=MARKUP)},
              {"stamp": STAMPS[2], "status": "deployed", "summary": "s", "provenance": "odd"}]
    text, _ = checked_page(listed)
    assert text.count("<td data-deployed>unknown</td>") == 2
    assert ("<td data-deployed>by &lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"
            "&quot;@laptop, specops 3f2a9c1d4e5f+dirty, inventory 9e8d7c6b1a2b</td>") in text
