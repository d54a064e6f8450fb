"""Releases on the host without the fleet (specops/agent/releases.py, restore.py) and how they are
listed (specops/output/releases.py, the report's table): a release `inv rollback` left behind is
shown rolled back, not "deployed" (issue 38)."""
import json
import os

import pytest

from specops import protocol
from specops.agent import releases, restore
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
    for module in (releases, restore):
        monkeypatch.setattr(module, "RELEASES", str(rel))
    monkeypatch.setattr(stacks, "STACKS_DIR", str(tmp_path / "venvs"))
    monkeypatch.setattr(restore, "_restart", lambda *a, **k: None)  # no systemd here
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
    restore.rollback(protocol.Rollback(to=first))
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
    restore.rollback(protocol.Rollback(to=third))
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
    monkeypatch.setattr(restore, "mark_rolled_back", broken)
    res = restore.rollback(protocol.Rollback(to=STAMPS[0]))
    assert res.to == STAMPS[0] and listed()[STAMPS[0]]["current"]
    assert res.notes == ["the releases left behind are not marked rolled back: No space left on device"]
