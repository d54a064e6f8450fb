"""What bootstrap installs with apt: rsync only where a peer copy runs (both of its ends).  The
fleet test is tests/test_bootstrap_peer_fleet.py."""
import json

from specops import inventory
from specops.ops import Context, Facts
from roles import system_packages
from roles import BOOTSTRAP
from roles import VOCABULARY

BASE = ["python3", "python3-venv", "ca-certificates"]
PEER = {"source": "peer", "host": "peer", "path": "/models/x"}


def load(tmp_path, box: dict, others=("peer", "bystander")):
    spec = {"box": {"services": [{"name": "sglang", "model_path": "/m", **box}]}, **{h: {} for h in others}}
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": spec}}))
    return inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts


def names(host):
    (op,) = system_packages.ops(host)
    return op.names


def test_rsync_only_on_the_two_ends_of_a_peer_copy(tmp_path):
    hosts = load(tmp_path, {"weights": PEER})
    assert names(hosts["box"]) == BASE + ["rsync", "openssh-client"]   # runs rsync over SSH
    assert names(hosts["peer"]) == BASE + ["rsync", "openssh-client"]  # serves it (rrsync, from the same package)
    assert names(hosts["bystander"]) == BASE
    draft = load(tmp_path, {"speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d"}, "draft_weights": PEER})
    assert names(draft["box"]) == BASE + ["rsync", "openssh-client"]
    hub = load(tmp_path, {"weights": {"source": "hf", "repo": "a/b", "revision": "main"}})
    assert names(hub["box"]) == BASE and names(hub["peer"]) == BASE


def test_apt_runs_before_the_peer_copy_and_only_for_what_is_missing(tmp_path):
    box = load(tmp_path, {"weights": PEER})["box"]
    (op,) = system_packages.ops(box)
    installed = {n: 0 for n in BASE + ["openssh-client"]}
    c = op.plan(Facts({"packages": {**installed, "rsync": 1}}), Context("box", False))
    assert [a.desc for a in c.actions] == ["apt-get install rsync"]
    assert not op.plan(Facts({"packages": {**installed, "rsync": 0}}), Context("box", False)).actions
    # The models role copies while it plans, so apt's batch must be applied (and the host probed
    # again) before it: the engine does that after a REPROBE role.
    assert system_packages.REPROBE and BOOTSTRAP.index(system_packages) < [r.NAME for r in BOOTSTRAP].index("models")
