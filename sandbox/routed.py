"""Workers behind a router on sandbox hosts, for the router's tests and its benchmark: their
inventory, and closed-loop clients that send /generate through the router while something
(a rolling deploy) happens."""
from __future__ import annotations

import copy
import http.client
import json
import threading
import time

from sandbox import provision
from sandbox.provision import sandbox_service
from specops.agent.bench.specbench import percentile


def inventory(workers: list, router, links: dict, index, port: int, key: str, knobs: dict | None = None,
              router_extra: dict | None = None) -> dict:
    """Groups `workers` (each reached by the router at links[name]) and `routers` (one router on
    `router`, installed from the sandbox's package `index`)."""
    # workers beyond loopback carry the router's key: the router sends it to them (kinds/router.py)
    svc = sandbox_service(bind="0.0.0.0", api_key=key, env={"SGLANG_SIM_STARTUP_DELAY": "1", "SGLANG_SIM_TOK_S": "2000",
                                               **(knobs or {})})
    hosts = {h.name: {**provision.host_vars(h), "services": [copy.deepcopy(svc)], "router_address": links[h.name]}
             for h in workers}  # copies: no YAML anchors, one worker's service can be changed alone
    routers = {router.name: {**provision.host_vars(router), "package_index": f"{index.url}/simple",
                             "services": [{"name": "router", "kind": "router", "port": port, "policy": "round_robin",
                                           "api_key": key, "workers": {"group": "workers"}, **(router_extra or {})}]}}
    return {"all": {"vars": {"venv": provision.VENV},
                    "children": {"workers": {"hosts": hosts}, "routers": {"hosts": routers}}}}


class Load:
    """Closed-loop clients sending /generate through the router until the block ends: what they saw."""

    def __init__(self, address: str, port: int, key: str, clients: int = 16, max_new_tokens: int = 16):
        self.address, self.port, self.key, self.max_new_tokens = address, port, key, max_new_tokens
        self.stop, self.lock, self.ok, self.failed = threading.Event(), threading.Lock(), [], []
        self.threads = [threading.Thread(target=self.client, daemon=True) for _ in range(clients)]

    def client(self):
        body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": self.max_new_tokens}})
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                conn = http.client.HTTPConnection(self.address, self.port, timeout=30)
                conn.request("POST", "/generate", body, headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                good = r.status == 200 and json.loads(data)["meta_info"]["completion_tokens"] == self.max_new_tokens
                error = None if good else f"HTTP {r.status}: {data[:120]!r}"
            except Exception as e:  # noqa: BLE001 (any failure is a failed request)
                error = f"{type(e).__name__}: {e}"
            with self.lock:
                (self.failed if error else self.ok).append(error or time.monotonic() - t0)

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(1)  # the load is running before what it watches starts
        return self

    def __exit__(self, *exc):
        time.sleep(1)
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def summary(self) -> dict:
        return {"served": len(self.ok), "failed": len(self.failed), "p50_s": percentile(self.ok, 50),
                "p99_s": percentile(self.ok, 99), "errors": sorted(set(str(e)[:80] for e in self.failed))[:5]}
