"""The real sglang-router in front of three workers, each on its own sandbox host
(test_router_fleet.py, test_router_status_fleet.py; tests/conftest.py's `routed` links them): their
inventory, a deploy with its --json report, and a request through the router."""
import json
import time
import urllib.request

import yaml

from sandbox.routed import inventory as routed_inventory
from support.files import load_json

WORKERS, ROUTER, PORT = ["t1", "t2", "t3"], "t4", 30010
KEY = "rk-7f3a9c"  # the router's API key (it listens beyond loopback)
AUTH = {"Authorization": f"Bearer {KEY}"}


def write_inventory(sandbox, hosts, links, index, knobs=None, router=None):
    doc = routed_inventory([hosts[w] for w in WORKERS], hosts[ROUTER], links, index, PORT, KEY, knobs, router)
    path = sandbox.tmp / "inventory"
    path.mkdir(exist_ok=True)
    (path / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def deploy(sandbox, inv, *args):
    report = sandbox.tmp / f"d{time.monotonic_ns()}.json"
    res = sandbox.inv("deploy", "--json", str(report), *args, inventory=inv, timeout=600)
    return res, (load_json(report)["hosts"] if report.exists() else {})


def through_router(h, path, body=None):
    req = urllib.request.Request(f"http://{h.address}:{PORT}{path}", method="POST" if body else "GET",
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json", **AUTH})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())
