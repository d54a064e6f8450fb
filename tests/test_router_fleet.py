"""The real sglang-router (0.3.2 from PyPI, a Rust binary that runs on CPU) in front of three
SGLang workers (the simulator), each on its own sandbox host.  The router's host reaches each
worker over a link straight between their namespaces (sandbox/peerlink.py), as boxes on one
rack network do; the controller reaches the router over its own link."""
import json
import re
import time

import pytest
import yaml

from sandbox.routed import Load
from support.router import KEY, PORT, ROUTER, WORKERS, deploy, through_router, write_inventory

pytestmark = pytest.mark.fleet


def started(h, unit):
    return h.run("systemctl", "show", unit, "-p", "ExecMainStartTimestampMonotonic").stdout


def test_a_router_and_three_workers_deploy_verify_and_show_in_status(sandbox, routed):
    hosts, links, index = routed
    inv = write_inventory(sandbox, hosts, links, index)
    res, rep = deploy(sandbox, inv, "--all")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    out = res.stdout
    assert "/workers: 3 worker(s), all healthy" in out and "router verified" in rep[ROUTER]["notes"], out[-3000:]
    r = hosts[ROUTER]
    unit = r.run("systemctl", "cat", "router").stdout
    assert all(f"http://{links[w]}:30000" in unit for w in WORKERS) and "\"--policy\" \"round_robin\"" in unit
    assert "sglang_router.launch_router" in unit
    # What the real router says of its workers, and a generation through it from outside.
    status, listing = through_router(r, "/workers")
    print("\nGET /workers:", json.dumps(listing)[:600])
    assert status == 200 and {w["url"] for w in listing["workers"]} == {f"http://{links[w]}:30000" for w in WORKERS}
    status, gen = through_router(r, "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 8}})
    assert status == 200 and gen["meta_info"]["completion_tokens"] == 8
    # status: per router, each worker in it, healthy, its load.
    st = sandbox.inv("status", "--all", inventory=inv)
    assert st.returncode == 0, st.stdout + st.stderr
    for w in WORKERS:
        assert f"{ROUTER}: router router: {w}/sglang (http://{links[w]}:30000): in the router, healthy, load" \
            in st.stdout, st.stdout
    # A second deploy changes nothing and restarts nothing.
    before = {n: started(h, "router" if n == ROUTER else "sglang") for n, h in hosts.items()}
    res, rep = deploy(sandbox, inv, "--all")
    assert res.returncode == 0, res.stdout[-3000:]
    changed = {n: [c for c in h["changes"] if c["changed"]] for n, h in rep.items()}
    assert changed == {n: [] for n in hosts}, changed
    assert "out of router" not in res.stdout  # a worker that needs no change is never taken out
    assert {n: started(h, "router" if n == ROUTER else "sglang") for n, h in hosts.items()} == before


def roll(sandbox, hosts, links, index, knobs, *args, workers_extra=None, max_new_tokens=16):
    inv = write_inventory(sandbox, hosts, links, index, knobs=knobs, router={"retries": False})
    if workers_extra:
        import yaml as y
        doc = y.safe_load((inv / "hosts.yml").read_text())
        for name, extra in workers_extra.items():
            doc["all"]["children"]["workers"]["hosts"][name]["services"][0].update(extra)
        (inv / "hosts.yml").write_text(y.safe_dump(doc, sort_keys=False))
    with Load(hosts[ROUTER].address, PORT, KEY, max_new_tokens=max_new_tokens) as load:
        res, rep = deploy(sandbox, inv, "--group", "workers", "--serial", "1", *args)
    return res, rep, load.summary()


@pytest.fixture
def serving(sandbox, routed):
    """Three workers behind the router (retries off: a lost request is not hidden), serving."""
    hosts, links, index = routed
    inv = write_inventory(sandbox, hosts, links, index, router={"retries": False})
    res, _ = deploy(sandbox, inv, "--all")
    assert res.returncode == 0, res.stdout[-6000:]
    return hosts, links, index


def test_a_rolling_deploy_behind_the_router_drops_no_request(sandbox, serving):
    hosts, links, index = serving
    # Requests of about a second (48 tokens at 40 tok/s): longer than taking a worker out takes, so
    # only waiting until it is idle keeps them whole.
    slow = write_inventory(sandbox, hosts, links, index, knobs={"SGLANG_SIM_TOK_S": "40"}, router={"retries": False})
    res = deploy(sandbox, slow, "--group", "workers")[0]
    assert res.returncode == 0, res.stdout[-4000:]
    before = {w: started(hosts[w], "sglang") for w in WORKERS}
    res, rep, load = roll(sandbox, hosts, links, index, {"SGLANG_SIM_TOK_S": "41"}, max_new_tokens=48)
    print(f"\nrolling deploy of 3 workers, --serial 1, 16 clients through the router: {load}")
    assert res.returncode == 0, res.stdout[-4000:]
    assert all(started(hosts[w], "sglang") != before[w] for w in WORKERS)  # each changed and restarted
    out = res.stdout
    for w in WORKERS:
        mine = "".join(line for line in out.splitlines(True) if line.startswith(w + " "))
        assert mine.index("is out of router") < mine.index("no request in flight") < mine.index("is back in router")
    assert load["failed"] == 0 and load["served"] > 50, load


def test_without_draining_the_same_roll_drops_requests(sandbox, serving):
    """The load test can fail: the same roll with --no-drain loses requests."""
    hosts, links, index = serving
    res, rep, load = roll(sandbox, hosts, links, index, {"SGLANG_SIM_TOK_S": "2200"}, "--no-drain")
    print(f"\nthe same roll with --no-drain: {load}")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "is out of router" not in res.stdout
    assert load["failed"] > 0, load


def test_a_worker_that_fails_verify_is_rolled_back_put_back_and_stops_the_roll(sandbox, serving):
    hosts, links, index = serving
    before = {w: started(hosts[w], "sglang") for w in WORKERS}
    res, rep, load = roll(sandbox, hosts, links, index, {"SGLANG_SIM_TOK_S": "2300"}, "--max-fail", "0",
                          workers_extra={"t2": {"verify": {"min_accept_length": 50}}})
    print(f"\na roll whose second worker fails verify: {load}")
    assert res.returncode != 0 and not rep["t1"].get("error"), (rep["t1"], res.stdout[-3000:])
    assert "rolled back" in rep["t2"]["notes"] and ", verified" in rep["t2"]["error"], rep["t2"]
    t2 = "".join(line for line in res.stdout.splitlines(True) if line.startswith("t2 "))
    assert "is back in router" in t2, t2[-2000:]
    assert rep["t3"]["error"].startswith("skipped") and started(hosts["t3"], "sglang") == before["t3"]
    assert started(hosts["t1"], "sglang") != before["t1"]
    assert load["failed"] == 0, load
    _, listing = through_router(hosts[ROUTER], "/workers")
    assert {w["url"] for w in listing["workers"] if w["is_healthy"]} == {f"http://{links[w]}:30000" for w in WORKERS}


SQUATTER = """import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open('/home/alice/captured', 'a') as f:
            f.write('%s %s %s\\n' % (self.command, self.path, self.headers.get('Authorization')))
        body = json.dumps({'text': 'squatted', 'meta_info': {'completion_tokens': 16}}).encode()
        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_POST = do_DELETE = do_GET
http.server.ThreadingHTTPServer(('0.0.0.0', 30000), H).serve_forever()
"""


@pytest.mark.security("router-key-squat", "alice binds a stopped worker's port (0.0.0.0:30000) on its host, answers "
                                          "everything 200 and logs each request with its Authorization header, "
                                          "while clients send /generate through the router")
def test_a_stopped_worker_is_out_of_its_router_so_a_squatter_on_its_port_gets_no_request(sandbox, serving):
    """Issue 23 item 2: the router kept a stopped worker's URL, so whoever bound the port next got
    users' prompts and the router's key (also its admin key).  A planned stop takes the worker out
    of its routers first; gpu-window (like rollback and spec-bench's baseline) puts it back once it
    verifies."""
    hosts, links, index = serving
    inv = write_inventory(sandbox, hosts, links, index, router={"retries": False})
    res = sandbox.inv("stop", "--host", "t1", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]
    stopped = "".join(line for line in res.stdout.splitlines(True) if line.startswith("t1 "))
    w = hosts["t1"]
    w.run("sh", "-c", "id alice >/dev/null 2>&1 || useradd -m alice; rm -f /home/alice/captured")
    w.run("systemd-run", "--unit", "squatter", "--uid", "alice", "python3", "-c", SQUATTER)
    deadline = time.monotonic() + 10
    while "LISTEN" not in w.run("ss", "-ltn", "sport = :30000", check=False).stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        with Load(hosts[ROUTER].address, PORT, KEY) as load:
            time.sleep(8)
        print(f"\nclients through the router while alice squats t1's port: {load.summary()}")
        captured = w.run("cat", "/home/alice/captured", check=False).stdout
        assert captured == "" and KEY not in captured, captured[:2000]
        assert load.summary()["failed"] == 0 and load.summary()["served"] > 20, load.summary()
    finally:
        w.run("systemctl", "stop", "squatter", check=False)
    assert stopped.index("is out of router") < stopped.index("sglang: stopped in") \
        < stopped.index("left out of the router"), stopped
    # Started again and verified: back in the router.
    res = sandbox.inv("gpu-window", "--host", "t1", "--", "true", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]
    t1 = "".join(line for line in res.stdout.splitlines(True) if line.startswith("t1 "))
    assert t1.index("is out of router") < t1.index("job exited") < t1.index("/generate ") \
        < t1.index("is back in router"), t1
    _, listing = through_router(hosts[ROUTER], "/workers")
    assert {x["url"] for x in listing["workers"] if x["is_healthy"]} == {f"http://{links[n]}:30000" for n in WORKERS}


def test_a_roll_ends_with_a_generation_through_the_router_and_status_says_when_it_does_not_serve(sandbox, serving):
    """Issue 23 item 8: after a --no-drain roll the real router's circuit breakers had taken every
    worker out (503 no_available_workers for about 60 s) while the deploy exited 0 and status showed
    each worker in the router and healthy: its /workers does not show it, a request through it does."""
    hosts, links, index = serving
    res, rep, load = roll(sandbox, hosts, links, index, {"SGLANG_SIM_TOK_S": "2400"}, "--no-drain")
    print(f"\n--no-drain roll: {load}")
    assert res.returncode == 0, res.stdout[-4000:]
    for w in WORKERS:
        mine = "".join(line for line in res.stdout.splitlines(True) if line.startswith(w + " "))
        said = re.search(rf"router {ROUTER}/router (serves: a generation through it answered 200|was not serving "
                         rf"after the roll; it serves again after \d+ s)", mine)
        assert said, mine[-2000:]
        print(f"{w}: {said.group(0)}")
    # Its workers stopped behind specops's back: the router still lists them, and serves nothing.
    for w in WORKERS:
        hosts[w].run("systemctl", "stop", "sglang")
    st = sandbox.inv("status", "--host", ROUTER, inventory=sandbox.tmp / "inventory")
    print(st.stdout)
    assert re.search(rf"^{ROUTER}: router router: NOT SERVING: /generate answered 5\d\d", st.stdout, re.M), st.stdout


# A landscape whose better settings beat the deployed one (steps 3, topk 1, draft tokens 4) by a
# margin no loaded box's noise hides: 2.9x there, 3.6x at steps 5 and 4.1x with a tree of 16 in
# the simulator's closed form (with ACCEPT_RATE 0.8 and DRAFT_COST 0.15 steps 5 led by 3 %, and a
# CI run kept the deployed one).
TUNE_KNOBS = {"SGLANG_SIM_TOK_S": "200", "SGLANG_SIM_ACCEPT_RATE": "0.9", "SGLANG_SIM_DRAFT_COST": "0.05"}


def test_a_winner_tuned_on_one_workers_traffic_rolls_to_all_three_with_no_request_lost(sandbox, serving):
    """With the router's clients running throughout: inv spec-tune --traffic on t1 takes its sample
    while t1 serves, then measures with t1 out of the router; its winner goes into the workers' vars
    and the ordinary rolling deploy, gated, takes it to all three.  No request fails."""
    from sandbox.provision import sandbox_service
    hosts, links, index = serving
    inv = write_inventory(sandbox, hosts, links, index, knobs=TUNE_KNOBS, router={"retries": False})
    doc = yaml.safe_load((inv / "hosts.yml").read_text())
    doc["all"]["children"]["workers"]["hosts"]["t1"]["services"][0]["tune"] = {
        "num_steps": [1, 3, 5], "eagle_topk": [1, 4], "num_draft_tokens": [4, 16]}
    (inv / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res, _ = deploy(sandbox, inv, "--group", "workers")
    assert res.returncode == 0, res.stdout[-4000:]
    with Load(hosts[ROUTER].address, PORT, KEY, max_new_tokens=16) as load:
        res = sandbox.inv("spec-tune", "--host", "t1", "--traffic", "60", "--traffic-wait", "120", "--concurrency",
                          "1", "--requests", "16", "--max-new-tokens", "48", inventory=inv, timeout=900)
        assert res.returncode == 0 and "best: " in res.stdout, res.stdout[-4000:]
        out = res.stdout
        # the sample came while t1 served; only then was it taken out of the router
        assert out.index("traffic sample: ") < out.index("sglang is out of router"), out[-4000:]
        rec = json.loads(hosts["t1"].run("cat", "/var/lib/specops/releases/current/tune.json").stdout)["sglang"]
        assert rec["load"]["prompts"] == "traffic sample" and rec["load"]["traffic"]["requests"] >= 60, rec["load"]
        assert rec["changes"] and rec["winner"] != {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}, out[-6000:]
        spec = {**sandbox_service()["speculative"], **rec["apply"]}
        # the README's way: the winner in every worker's vars, a rolling deploy held by a gate
        gate = {"min_accept_length": 3.0, "load": {"concurrency": [1], "requests": 8, "max_new_tokens": 32}}
        inv = write_inventory(sandbox, hosts, links, index, knobs=TUNE_KNOBS, router={"retries": False})
        doc = yaml.safe_load((inv / "hosts.yml").read_text())
        for w in WORKERS:
            doc["all"]["children"]["workers"]["hosts"][w]["services"][0].update(speculative=spec, gate=gate)
        (inv / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        res, rep = deploy(sandbox, inv, "--group", "workers", "--serial", "1", "--bench")
    load = load.summary()
    print(f"\nthe winner {rec['winner']} (tuned on t1's traffic) rolled to 3 workers, --serial 1, 16 clients "
          f"through the router throughout: {load}")
    assert res.returncode == 0, res.stdout[-4000:]
    assert load["failed"] == 0 and load["served"] > 20, load
    assert res.stdout.count("sglang: gate passed: accept length") == 3, res.stdout[-4000:]
    assert hosts["t1"].run("sh", "-c", "ls -A /var/lib/specops/traffic", check=False).stdout.strip() == ""
    for w in WORKERS:
        info = json.loads(hosts[w].run("curl", "-s", "-H", f"Authorization: Bearer {KEY}",
                                       "http://127.0.0.1:30000/server_info").stdout)
        assert {k: info[f"speculative_{k}"] for k in rec["winner"]} == rec["winner"], (w, info)
