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
