"""The router kind without a fleet: its workers from the inventory, its command line, its unit."""
import pytest
import yaml

from specops import inventory
from specops.errors import UsageError
from specops.kinds import kind_of
from specops.kinds.router import routers_of, workers_of
from roles import VOCABULARY


def load(tmp_path, worker_bind="0.0.0.0", router_extra=None):
    svc = {"name": "sglang", "model_path": "/m", "bind": worker_bind, "port": 30001}
    doc = {"all": {"children": {
        "workers": {"hosts": {"w1": {"address": "10.0.0.1", "services": [svc]},
                              "w2": {"address": "10.0.0.2", "router_address": "10.9.0.2", "services": [svc]}}},
        "edge": {"hosts": {"r": {"address": "10.0.0.9", "services": [
            {"name": "router", "kind": "router", "workers": {"group": "workers"}, "api_key": "rk-1",
             **(router_extra or {})}]}}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    return inventory.load(tmp_path, VOCABULARY)


def test_workers_come_from_the_group_at_the_address_the_router_uses(tmp_path):
    inv = load(tmp_path)
    r = inv.hosts["r"]
    svc = r["services"][0]
    assert [w.url for w in workers_of(r, svc)] == ["http://10.0.0.1:30001", "http://10.9.0.2:30001"]
    assert [(h.name, [w.host for w in ws]) for h, _, ws in routers_of(inv, "w2")] == [("r", ["w2"])]
    argv = kind_of(svc).argv({**svc, "worker_urls": ["http://a:1"]}, "/opt/sglang/venv")
    assert argv[0] == "/opt/sglang-router/venv/bin/python" and "sglang_router.launch_router" in argv
    assert argv[-2:] == ["--worker-urls", "http://a:1"] and "--disable-retries" not in argv
    assert "--disable-retries" in kind_of(svc).args({**svc, "retries": False})


def test_a_worker_the_router_cannot_reach_is_refused_in_one_line(tmp_path):
    inv = load(tmp_path, worker_bind="127.0.0.1")
    with pytest.raises(UsageError, match=r"worker w1/sglang listens on 127.0.0.1 only; give it `bind: 0.0.0.0`"):
        workers_of(inv.hosts["r"], inv.hosts["r"]["services"][0])


def test_an_unknown_group_is_refused(tmp_path):
    inv = load(tmp_path, router_extra={"workers": {"group": "nope"}})
    with pytest.raises(UsageError, match="workers.group 'nope' is not a group"):
        workers_of(inv.hosts["r"], inv.hosts["r"]["services"][0])


def test_the_router_unit_names_every_worker(tmp_path):
    from roles import router
    inv = load(tmp_path)
    text = router.router_unit_text(inv.hosts["r"], inv.hosts["r"]["services"][0])
    assert '"--worker-urls" "http://10.0.0.1:30001" "http://10.9.0.2:30001"' in text or \
        "--worker-urls http://10.0.0.1:30001 http://10.9.0.2:30001" in text
    assert "Description=SGLang router router" in text


def test_an_open_router_or_a_key_it_does_not_send_is_refused(tmp_path):
    inv = load(tmp_path)
    r = inv.hosts["r"]
    svc = {k: v for k, v in r["services"][0].items() if k != "api_key"}
    with pytest.raises(UsageError, match="listening on 0.0.0.0, it needs an api_key"):
        workers_of(r, svc)
    assert workers_of(r, {**svc, "bind": "127.0.0.1"})  # on loopback only: no key needed
    inv.hosts["w1"]["services"][0]["api_key"] = "other"
    with pytest.raises(UsageError, match="worker w1/sglang has an api_key the router does not send"):
        workers_of(r, {**svc, "api_key": "rk-1"})


def test_a_baseline_of_a_router_is_refused_before_connecting(tmp_path):
    """Issue 23 item 2: spec-bench --baseline on a router's host stopped the router (an outage for
    every client) and measured its 503."""
    from support.inventories import run_without_connecting
    res, attempts = run_without_connecting(tmp_path, """
        all:
          children:
            workers:
              hosts:
                w: {{address: 127.0.0.1, ssh_port: {port}, connect_timeout: 2,
                    services: [{{name: sglang, model_path: /m, bind: 0.0.0.0}}]}}
            edge:
              hosts:
                r: {{address: 127.0.0.1, ssh_port: {port}, connect_timeout: 2,
                    services: [{{name: router, kind: router, workers: {{group: workers}}, api_key: rk-1}}]}}
        """, "spec-bench", "--host", "r", "--baseline")
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "r: router is a router: --baseline measures an SGLang server without speculation" in lines[0]
    assert attempts == 0


@pytest.mark.parametrize("bind", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_a_router_on_loopback_needs_no_key(tmp_path, bind):
    """Issue 24, item 6: every loopback spelling (seen red with only '127.' counted: localhost and
    ::1 were taken for open routers)."""
    inv = load(tmp_path)
    r = inv.hosts["r"]
    svc = {k: v for k, v in r["services"][0].items() if k != "api_key"}
    assert workers_of(r, {**svc, "bind": bind})


def test_why_a_worker_is_not_in_the_router_is_read_from_the_routers_log():
    """Issue 24 (a new user's rough edge): verify said only `not listed: URL`.  The lines are the
    real sglang-router 0.3.2's (the sandbox index's wheel, run on this machine, colours and all):
    registering a worker that refuses connections (and one answering 404), a listed worker whose
    health checks then failed, and one removed through DELETE /workers/<id>."""
    from specops.agent.services.routing import said_in
    from support import ROOT
    log = (ROOT / "tests" / "support" / "router_0.3.2.log").read_text()
    refused, answered_404, dropped = "http://127.0.0.1:38999", "http://10.254.254.1:30000", "http://127.0.0.1:38997"
    assert said_in(log, [refused, answered_404, dropped, "http://127.0.0.1:3899"]) == {
        refused: f"Health check failed: error sending request for url ({refused}/health)",
        answered_404: f"Health check failed: HTTP status client error (404 Not Found) for url ({answered_404}/health)",
        dropped: f"Removed worker {dropped}"}  # its last line; a longer port is another worker
    before_removal = log.rstrip("\n").rsplit("\n", 1)[0]
    assert said_in(before_removal, [dropped]) == {dropped: f"HTTP health check failed for {dropped}/health: "
                                                           "Connection refused"}
    assert said_in(log.split("\n", 1)[0], [dropped]) == {}  # named at start-up, nothing wrong said of it
