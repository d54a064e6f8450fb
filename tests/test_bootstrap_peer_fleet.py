"""Bootstrap of a bare box whose weights come from a peer: apt brings rsync first (the copy runs
it while the models role plans), then the copy, then serving; a second run changes nothing.
Which hosts get rsync, and which do not, is tests/test_bootstrap_packages.py."""
import pytest

from sandbox import aptrepo, hub as hub_mod, logins, peerlink, provision
from sandbox.provision import sandbox_service
from support.hosts import host_snapshot
from support.site import run_inv

pytestmark = pytest.mark.fleet
PEER_PATH, DEST = "/models/peer-llama", "/models/copied-llama"


def installed(h, package):
    return h.run("dpkg-query", "-W", "-f=${Status}", package, check=False).stdout == "install ok installed"


@pytest.mark.reliability("second-run", "idempotence")
def test_bootstrap_installs_rsync_for_a_peer_source_then_copies(sandbox, pkg_index):
    dest = sandbox.reset("t1", layers=[provision.layer("bare")])
    peer = sandbox.reset("t2", flavour="ubuntu-sudo")
    _, address = peerlink.up(dest, peer)
    try:
        peer.run("mkdir", "-p", PEER_PATH)
        for name, data in hub_mod.REPOS["sandbox/tiny-llama"].items():
            peer.path(f"{PEER_PATH}/{name}").write_bytes(data)
        aptrepo.serve(dest, ["rsync"])  # the only apt source, and rsync taken off: a rented box's state
        assert not installed(dest, "rsync")
        peer_source = {"source": "peer", "host": "t2", "address": address}
        svc = sandbox_service(model_path=DEST, weights={**peer_source, "path": PEER_PATH},  # a bare box has no /models
                              draft_weights={**peer_source, "path": "/models/tiny-llama-eagle3"})
        inv = sandbox.inventory({
            "t1": {"services": [svc], "sglang": {"version": "0.5.23"}, "package_index": f"{pkg_index.url}/simple",
                   "torch": {"version": "2.9.1", "cuda": "auto", "index_url": f"{pkg_index.url}/whl/{{variant}}"}},
            "t2": {**provision.host_vars(peer), **logins.host_vars("ubuntu-sudo")}})
        res, rep = run_inv(sandbox, inv, "bootstrap", "--host", "t1", timeout=600)
        assert res.returncode == 0, res.stdout[-3000:]
        assert "apt packages: changed (install rsync)" in res.stdout, res.stdout[-3000:]
        assert installed(dest, "rsync") and "sglang verified" in rep["t1"]["notes"]
        assert dest.path(f"{DEST}/config.json").read_bytes() == hub_mod.REPOS["sandbox/tiny-llama"]["config.json"]

        before = host_snapshot(dest)
        res, rep = run_inv(sandbox, inv, "bootstrap", "--host", "t1")
        assert res.returncode == 0 and rep["t1"]["changed"] == 0, res.stdout[-3000:]
        assert host_snapshot(dest) == before
    finally:
        peerlink.down(dest, peer)
