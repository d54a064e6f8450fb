"""The weights manifest's no-op rule and the inventory's weights sources: no fleet needed."""
import json
import os

import pytest

from specops import inventory
from specops.agent import weights
from specops.errors import UsageError


def test_the_probe_compares_sizes_and_mtimes_only(tmp_path, monkeypatch):
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
    with open(dest / "a.safetensors", "r+b") as f:  # a changed byte, size and mtime kept: not seen
        f.write(b"y")
    os.utime(dest / "a.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.fact(str(dest))["differ"] == []
    os.utime(dest / "config.json", ns=(1, 1))  # a moved mtime is
    (dest / "a.safetensors").unlink()           # and so is a missing file
    assert sorted(weights.fact(str(dest))["differ"]) == ["a.safetensors", "config.json"]


def test_weights_sources_are_checked_before_connecting(tmp_path):
    def load(source):
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {"services": [
            {"name": "sglang", "model_path": "/m", "weights": source}]}}}}))
        return inventory.load(tmp_path / "hosts.yml")
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
