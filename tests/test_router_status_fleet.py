"""What status and verify say of a real sglang-router's workers on sandbox hosts: a worker the router
lost, why the router does not use one (what its log says), and a worker bound to IPv6 loopback,
reached there by its router, verify and status."""
import time
import urllib.request

import pytest
import yaml

from support.router import AUTH, KEY, PORT, ROUTER, deploy, through_router, write_inventory

pytestmark = pytest.mark.fleet


def test_status_names_a_worker_the_router_lost(sandbox, routed):
    hosts, links, index = routed
    inv = write_inventory(sandbox, hosts, links, index)
    res, _ = deploy(sandbox, inv, "--all")
    assert res.returncode == 0, res.stdout[-3000:]
    r = hosts[ROUTER]
    _, listing = through_router(r, "/workers")
    gone = next(w for w in listing["workers"] if w["url"] == f"http://{links['t2']}:30000")
    req = urllib.request.Request(f"http://{r.address}:{PORT}/workers/{gone['id']}", method="DELETE", headers=AUTH)
    with urllib.request.urlopen(req, timeout=10) as answer:
        assert answer.status == 202
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(through_router(r, "/workers")[1]["workers"]) != 2:
        time.sleep(0.5)
    st = sandbox.inv("status", "--host", ROUTER, inventory=inv)
    assert f"t2/sglang (http://{links['t2']}:30000): NOT in the router" in st.stdout, st.stdout
    # (what verify says of it: test_verify_says_why_the_router_does_not_use_a_worker, which waits
    # 20 s for the worker to come back, not the default 120 s this one waited)


def test_verify_says_why_the_router_does_not_use_a_worker(sandbox, routed):
    """Issue 24 (a new user's rough edge): verify said only `not listed: URL`.  What the real router
    logged of each worker it does not use: one removed through its API, one whose health checks fail
    (its server stopped), and, once the router restarts, that one refusing to be registered."""
    hosts, links, index = routed
    inv = write_inventory(sandbox, hosts, links, index, router={
        "extra_args": ["--health-check-interval-secs", "2"], "verify": {"timeout": 20}})
    res, _ = deploy(sandbox, inv, "--all")
    assert res.returncode == 0, res.stdout[-3000:]
    r, t1, t2 = hosts[ROUTER], f"http://{links['t1']}:30000", f"http://{links['t2']}:30000"
    _, listing = through_router(r, "/workers")
    gone = next(w for w in listing["workers"] if w["url"] == t1)
    req = urllib.request.Request(f"http://{r.address}:{PORT}/workers/{gone['id']}", method="DELETE", headers=AUTH)
    with urllib.request.urlopen(req, timeout=10) as answer:
        assert answer.status == 202
    hosts["t2"].run("systemctl", "stop", "sglang")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and {(w["url"], w["is_healthy"]) for w in through_router(r, "/workers")[1][
            "workers"] if w["url"] in (t1, t2)} != {(t2, False)}:
        time.sleep(0.5)
    first = sandbox.inv("verify", "--host", ROUTER, inventory=inv)
    r.run("systemctl", "restart", "router")  # it registers its workers afresh: t2 cannot be reached
    second = sandbox.inv("verify", "--host", ROUTER, inventory=inv)
    said = [res.stdout[res.stdout.index("/workers: not listed"):].splitlines()[0] for res in (first, second)]
    print("\n" + "\n".join(said))
    assert first.returncode == second.returncode == 1, first.stdout[-2000:] + second.stdout[-2000:]
    assert said == [f"/workers: not listed: {t1} (the router's log: Removed worker {t1}); not healthy: {t2} (the "
                    f"router's log: HTTP health check failed for {t2}/health: Connection refused)",
                    f"/workers: not listed: {t2} (the router's log: Health check failed: error sending request for "
                    f"url ({t2}/health))"], said


def test_a_worker_bound_to_ipv6_loopback_is_reached_there_by_its_router_verify_and_status(sandbox, pkg_index):
    """A server with `bind: "::1"` listens on ::1 alone (SGLang's uvicorn takes an IPv6 socket): the
    router on its host sends to http://[::1]:PORT, verify and status read it there, and a
    generation goes through the router.  127.0.0.1 would find no one (or someone else's server)."""
    from sandbox import provision
    from sandbox.provision import sandbox_service
    h = sandbox.reset(ROUTER)
    worker = sandbox_service(bind="::1", port=30001, env={"SGLANG_SIM_STARTUP_DELAY": "1"})
    router = {"name": "router", "kind": "router", "port": PORT, "policy": "round_robin", "api_key": KEY,
              "workers": {"group": "box"}}
    doc = {"all": {"vars": {"venv": provision.VENV}, "children": {"box": {"hosts": {ROUTER: {
        **provision.host_vars(h), "package_index": f"{pkg_index.url}/simple", "services": [worker, router]}}}}}}
    inv = sandbox.tmp / "inventory-ipv6"
    inv.mkdir(exist_ok=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res, rep = deploy(sandbox, inv, "--host", ROUTER)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "/workers: 1 worker(s), all healthy" in res.stdout, res.stdout[-3000:]
    listening = h.run("ss", "-Hltn", "sport = :30001").stdout
    assert "[::1]:30001" in listening and "127.0.0.1:30001" not in listening, listening
    assert '"http://[::1]:30001"' in h.run("systemctl", "cat", "router").stdout
    status, listing = through_router(h, "/workers")
    assert status == 200 and [w["url"] for w in listing["workers"]] == ["http://[::1]:30001"], listing
    for _ in range(3):
        status, gen = through_router(h, "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 8}})
        assert status == 200 and gen["meta_info"]["completion_tokens"] == 8
    st = sandbox.inv("status", "--host", ROUTER, inventory=inv)
    assert st.returncode == 0, st.stdout + st.stderr
    assert f"{ROUTER}: sglang in production:" in st.stdout and "/metrics:" not in st.stdout, st.stdout
    assert f"{ROUTER}: router router: {ROUTER}/sglang (http://[::1]:30001): in the router, healthy" in st.stdout, \
        st.stdout
