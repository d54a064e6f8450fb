"""The weights manifest's no-op rule and the inventory's weights sources: no fleet needed."""
import json
import os
import time

import pytest

from specops import inventory
from specops.agent import weights
from specops.errors import UsageError
from roles import VOCABULARY
from support.weights import fetch_again, fetched


def test_the_probe_compares_sizes_and_mtimes_and_hashes_only_what_was_written_after_its_manifest(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "WEIGHTS_DIR", str(tmp_path / "manifests"))
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "a.safetensors").write_bytes(b"x" * 100)
    (dest / "config.json").write_text("{}")
    files = {n: {"size": (dest / n).stat().st_size, "mtime_ns": (dest / n).stat().st_mtime_ns, "sha256": "-"}
             for n in ("a.safetensors", "config.json")}
    weights.write_manifest(str(dest), {"source": {"repo": "o/n"}, "files": files})
    assert oct(os.stat(weights.manifest_path(str(dest))).st_mode & 0o777) == "0o600"
    fact = weights.fact(str(dest))
    assert fact["differ"] == [] and fact["manifest"]["files"] == files and fact["free"] > 0

    st = (dest / "a.safetensors").stat()
    with open(dest / "a.safetensors", "r+b") as f:  # a changed byte, size and mtime kept: seen by its ctime
        f.write(b"y")
    os.utime(dest / "a.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.fact(str(dest))["differ"] == ["a.safetensors"]  # (the hash it was compared by is "-")
    m = json.loads(open(weights.manifest_path(str(dest))).read())
    m["written_at"] = time.time() + 60  # ... and not when written before its manifest: nothing is hashed
    open(weights.manifest_path(str(dest)), "w").write(json.dumps(m))
    assert weights.fact(str(dest))["differ"] == []
    os.utime(dest / "config.json", ns=(1, 1))  # a moved mtime is
    (dest / "a.safetensors").unlink()           # and so is a missing file
    assert sorted(weights.fact(str(dest))["differ"]) == ["a.safetensors", "config.json"]


def test_weights_sources_are_checked_before_connecting(tmp_path):
    def load(source):
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {"services": [
            {"name": "sglang", "model_path": "/m", "weights": source}]}}}}))
        return inventory.load(tmp_path / "hosts.yml", VOCABULARY)
    assert load({"source": "hf", "repo": "org/name", "revision": "main"}).hosts["box"]
    with pytest.raises(UsageError, match="weights.source: must be one of hf, controller, peer"):
        load({"source": "ftp", "repo": "org/name", "revision": "main"})
    with pytest.raises(UsageError, match="weights.repo: a hub repository is ORG/NAME"):
        load({"source": "hf", "repo": "name", "revision": "main"})
    from roles import models
    with pytest.raises(UsageError, match="box: service 'sglang': weights: a hf source needs repo and revision "
                                         r"\(revision is missing\)"):
        models.ops(load({"source": "hf", "repo": "org/name"}).hosts["box"])
    with pytest.raises(UsageError, match="weights path /nonexistent/m is not a directory on the controller"):
        models.ops(load({"source": "controller", "path": "/nonexistent/m"}).hosts["box"])
    with pytest.raises(UsageError, match="the endpoint must not carry credentials") as refused:
        models.ops(load({"source": "hf", "repo": "o/n", "revision": "main",
                         "endpoint": "https://u:pa55word@mirror/"}).hosts["box"])
    assert "pa55word" not in str(refused.value)


def test_pushes_to_one_filesystem_are_counted_together(tmp_path):
    """A target and a draft pushed in one run: the second is checked against what the first takes."""
    from roles import models
    from specops.ops import Context, Facts, PlanError
    for name, size in (("target", 600), ("draft", 500)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "w.safetensors").write_bytes(b"x" * size)
    svc = {"name": "sglang"}
    empty = {"manifest": None, "differ": [], "partial": {}, "present": {}, "device": 7,
             "free": models.MARGIN_MIN + 1000}
    facts = Facts({"weights": {"/m/target": empty, "/m/draft": empty}})
    ctx = Context("box", check=False)
    target = models.Pushed(svc, "/m/target", {"source": "controller", "path": str(tmp_path / "target")})
    draft = models.Pushed(svc, "/m/draft", {"source": "controller", "path": str(tmp_path / "draft")})
    assert target.plan(facts, ctx).uploads  # 600 of the 1000 bytes beyond the margin
    with pytest.raises(PlanError, match=r"not enough disk for .*/draft in /m/draft: need 0.0 MiB"):
        draft.plan(facts, ctx)  # 500 more do not fit: the first push is counted
    assert draft.plan(facts, Context("box", check=False)).uploads  # alone it would


def test_a_manifest_rewritten_with_the_same_content_keeps_when_it_last_changed(tmp_path, monkeypatch):
    """changed_at is when the weights' content last changed: a re-fetch that moves nothing, or a
    new mtime with the same sha256s, must not make a running server look older than its weights."""
    monkeypatch.setattr(weights, "WEIGHTS_DIR", str(tmp_path / "manifests"))
    files = {"model.safetensors": {"size": 3, "mtime_ns": 1, "sha256": "aa"}}
    weights.write_manifest("/models/m", {"dest": "/models/m", "files": files})
    first = weights.read_manifest("/models/m")["changed_at"]
    assert first > 0
    monkeypatch.setattr(weights.time, "time", lambda: first + 1000)
    weights.write_manifest("/models/m", {"dest": "/models/m", "files": {
        "model.safetensors": {"size": 3, "mtime_ns": 2, "sha256": "aa"}}})
    assert weights.read_manifest("/models/m")["changed_at"] == first
    weights.write_manifest("/models/m", {"dest": "/models/m", "files": {
        "model.safetensors": {"size": 3, "mtime_ns": 2, "sha256": "bb"}}})
    assert weights.read_manifest("/models/m")["changed_at"] == first + 1000


def test_a_server_started_before_its_weights_changed_is_restarted_saying_so():
    from specops.layout import STATE_FILE
    from specops.ops import Context, Facts, RunningCode
    op = RunningCode("sglang", [], ["/models/m"])

    def plan(changed_at, started=1000.0):
        facts = Facts({"units": {"sglang": {"ActiveState": "active", "ExecMainStartTimestamp": started}},
                       "files": {STATE_FILE: {"exists": False}},
                       "weights": {"/models/m": {"manifest": {"changed_at": changed_at}}}})
        return op.plan(facts, Context("box", False))
    assert plan(changed_at=2000.0).summary == "weights changed since the server started (/models/m); restart"
    assert plan(changed_at=2000.0).notify and plan(changed_at=2000.0).stale
    assert plan(changed_at=500.0).summary == "ok"
    assert plan(changed_at=0).summary == "ok"  # unchanged since before it was kept


def test_the_probe_says_when_a_weights_file_last_changed_by_its_ctime_which_an_edit_cannot_put_back(
        tmp_path, monkeypatch):
    """Issue 36 item 5: an edit that puts the mtime back still moves the ctime, which is what a
    server that started before it is stale by."""
    dest = fetched(tmp_path, monkeypatch)
    fact = weights.fact(str(dest))
    assert fact["newest"][0] == max(os.stat(dest / n).st_ctime for n in ("a.safetensors", "config.json"))
    st = (dest / "a.safetensors").stat()
    time.sleep(0.02)
    with open(dest / "a.safetensors", "r+b") as f:
        f.write(b"y")
    os.utime(dest / "a.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    fact = weights.fact(str(dest))
    # size and mtime kept, but written after the manifest: the probe hashes it, and it differs ...
    assert fact["differ"] == ["a.safetensors"]
    assert fact["newest"] == [os.stat(dest / "a.safetensors").st_ctime, "a.safetensors"]  # ... and is newer
    assert fact["newest"][0] > st.st_ctime
    assert weights.seen(str(dest)) == (fact["manifest"], [], fact["newest"])  # verify does not hash
    # a chmod moves the ctime too: hashed, the same bytes, not drift
    (dest / "a.safetensors").write_bytes(b"a.safetensors" * 10)
    os.utime(dest / "a.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.fact(str(dest))["differ"] == []
    assert weights.seen(str(tmp_path / "gone"))[1:] == ([], None)


def _running(weights_fact, started=1000.0, sources=()):
    from specops.layout import STATE_FILE
    from specops.ops import Context, Facts, RunningCode
    facts = Facts({"units": {"sglang": {"ActiveState": "active", "ExecMainStartTimestamp": started}},
                   "files": {STATE_FILE: {"exists": False}, **{s: {"exists": True, "path": s, "mtime": 1.0}
                                                               for s in sources}},
                   "weights": {"/models/m": weights_fact}})
    return RunningCode("sglang", [*sources], ["/models/m"]).plan(facts, Context("box", False))


def test_a_weights_file_written_after_the_start_or_differing_from_the_manifest_restarts_the_server():
    """Issue 36 item 5 (a, b): the hub's bytes put back after a start, or an edit the server
    started after, is not what the manifest says runs: stale, and the restart is the change."""
    kept = {"manifest": {"changed_at": 500.0}, "differ": [], "newest": [600.0, "a.safetensors"]}
    assert _running(kept).summary == "ok"
    rewritten = dict(kept, newest=[2000.0, "a.safetensors"])
    c = _running(rewritten)
    assert c.summary == "weights changed since the server started (/models/m); restart" and c.stale and c.notify
    edited = dict(kept, differ=["a.safetensors"])
    c = _running(edited)
    assert c.summary == ("running weights that differ from their manifest (/models/m: 1 file(s) changed on the "
                         "host); restart") and c.stale and c.notify
    # the draft's config.json that draft_config edits is the service's own file, not drift of its weights
    assert _running(dict(kept, differ=["config.json"]), sources=["/models/m/config.json"]).summary == "ok"


def test_verify_fails_a_server_older_than_a_weights_file_or_running_weights_that_are_not_the_manifests(
        tmp_path, monkeypatch):
    """Issue 36 item 5 (b): docs/deploy.md's words, and verify fails (it passed before: only the
    manifest's changed_at was looked at)."""
    import types
    from specops.agent.services import running
    monkeypatch.setattr(running, "read_state", dict)
    dest = fetched(tmp_path, monkeypatch)

    def check(started, managed=()):
        report = types.SimpleNamespace(failures=[], stale=False)
        running.stale_check(types.SimpleNamespace(managed=list(managed), weights=[str(dest)]), report,
                            {"ExecMainStartTimestamp": started})
        return report
    now = time.time()
    assert check(now + 60).failures == []
    st = (dest / "a.safetensors").stat()
    (dest / "a.safetensors").write_bytes(b"hers" * 5)  # size kept
    os.utime(dest / "a.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # mtime moved back
    report = check(now - 60)  # started before the edit
    assert report.stale and len(report.failures) == 1
    assert report.failures[0].startswith("weights changed since the server started: it started at ")
    assert report.failures[0].endswith(", the weights in %s (a.safetensors) changed at %s"
                                       % (dest, time.strftime("%H:%M:%S", time.gmtime(os.stat(dest / "a.safetensors")
                                                                                       .st_ctime))))
    report = check(now + 60)  # restarted by hand after it: runs the edited bytes
    assert report.stale and report.failures == [
        "weights differ from their manifest: %s/a.safetensors changed on the host before the server started "
        "(at %s); a deploy puts back the manifest's and restarts it" % (dest, time.strftime("%H:%M:%S",
                                                                                            time.gmtime(now + 60)))]
    assert check(now + 60, managed=[str(dest / "a.safetensors")]).failures == []  # draft_config's own file


def test_a_fetch_hashes_a_file_edited_with_its_size_and_mtime_put_back_and_fetches_it_again(tmp_path, monkeypatch):
    """Issue 49 (protective line 2): _stale's ctime clause.  A byte changed after the manifest was
    written, with the size kept and the mtime put back by os.utime, matches the manifest on size and
    mtime; only its ctime tells.  The fetch must hash it and fetch it again, not keep it and write a
    manifest that blesses the tampered bytes (a server would restart onto them)."""
    import hashlib
    dest = fetched(tmp_path, monkeypatch)
    hub = {n: n.encode() * 10 for n in ("a.safetensors", "config.json")}
    time.sleep(0.05)  # the edit's ctime past the manifest's written_at, whatever the clock's grain
    st = (dest / "a.safetensors").stat()
    with open(dest / "a.safetensors", "r+b") as f:
        f.write(b"Z")
    os.utime(dest / "a.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = (dest / "a.safetensors").stat()
    assert (edited.st_size, edited.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert (dest / "a.safetensors").read_bytes() != hub["a.safetensors"]

    def download(req, python, dfd, commit, stale, progress):
        for f in stale:
            fd = os.open(f["name"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
            with os.fdopen(fd, "wb") as out:
                out.write(hub[f["name"]])
    info = {"commit": "c1", "files": [{"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest(),
                                       "blob": None} for n, d in hub.items()]}
    monkeypatch.setattr(weights, "say", lambda *a: None)
    monkeypatch.setattr(weights, "tool_python", lambda req: "/nonexistent/python")
    monkeypatch.setattr(weights, "ask", lambda *a: json.dumps(info))
    monkeypatch.setattr(weights, "download", download)
    res = fetch_again(dest, verify=False)
    assert res["fetched"] == ["a.safetensors"]
    assert (dest / "a.safetensors").read_bytes() == hub["a.safetensors"]
    files = weights.read_manifest(str(dest))["files"]
    assert files["a.safetensors"]["sha256"] == hashlib.sha256((dest / "a.safetensors").read_bytes()).hexdigest()
