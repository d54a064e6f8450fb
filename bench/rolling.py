"""A zero-downtime rolling deploy of 10 workers behind the real sglang-router, measured.

    python bench/rolling.py            # writes bench/rolling.md and its section of BENCHMARKS.md

Eleven sandbox hosts (their own site): ten SGLang workers (the simulator) and the router on the
eleventh, which reaches each worker over a link straight between their namespaces.  After a
first deploy of all of them, every worker changes (a new env value, so each restarts) and
`inv deploy --group workers --serial 2` rolls them two at a time while 16 closed-loop clients
send /generate through the router (retries off: a lost request is not hidden).  Reported: the
roll's wall time, requests served and failed during it, and their latency.
"""
from __future__ import annotations

import copy
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from sandbox import fleet, peerlink, pkgindex, provision  # noqa: E402
from sandbox.provision import sandbox_service  # noqa: E402

SITE = fleet.Site("sor", "192.168.239", Path("/var/lib/specops-bench-rolling"))
MARK, END = "<!-- rolling -->", "<!-- /rolling -->"
WORKERS, PORT, CLIENTS = 10, 30010, 16
KEY = "bench-router-key"  # a router beyond loopback needs one


def inventory(work: Path, f, links, index, tok_s: str) -> Path:
    svc = sandbox_service(bind="0.0.0.0", env={"SGLANG_SIM_STARTUP_DELAY": "1", "SGLANG_SIM_TOK_S": tok_s})
    hosts = f.hosts
    workers = {h.name: {**provision.host_vars(h), "services": [copy.deepcopy(svc)], "router_address": links[h.name]}
               for h in hosts[:WORKERS]}
    r = hosts[WORKERS]
    routers = {r.name: {**provision.host_vars(r), "package_index": f"{index.url}/simple", "services": [
        {"name": "router", "kind": "router", "port": PORT, "policy": "round_robin", "retries": False, "api_key": KEY,
         "workers": {"group": "workers"}}]}}
    doc = {"all": {"vars": {"venv": provision.VENV},
                   "children": {"workers": {"hosts": workers}, "routers": {"hosts": routers}}}}
    (work / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return work


def inv(work: Path, *args) -> float:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, text=True, capture_output=True,
                         env={**os.environ, "SPECOPS_INVENTORY": str(work)}, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"inv {' '.join(args)} failed:\n{res.stdout[-4000:]}\n{res.stderr[-2000:]}")
    return time.perf_counter() - t0


def load(address: str, stop: threading.Event, seen: list) -> None:
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 16}})
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            conn = http.client.HTTPConnection(address, PORT, timeout=30)
            conn.request("POST", "/generate", body, {"Content-Type": "application/json",
                                                     "Authorization": f"Bearer {KEY}"})
            r = conn.getresponse()
            r.read()
            conn.close()
            seen.append(time.monotonic() - t0 if r.status == 200 else None)
        except Exception:  # noqa: BLE001 (a failed request)
            seen.append(None)


def measure() -> dict:
    f = fleet.Fleet([f"r{i}" for i in range(1, WORKERS + 2)], layers=[provision.layer("gpubox")], site=SITE).up()
    index = None
    try:
        provision.write_known_hosts(f)
        index = pkgindex.Index(f.site).start()
        router = f.hosts[WORKERS]
        links = {h.name: peerlink.up(router, h)[1] for h in f.hosts[:WORKERS]}
        work = Path(tempfile.mkdtemp(prefix="specops-rolling-"))
        inv(inventory(work, f, links, index, "2000"), "deploy", "--all", "--quiet")
        inventory(work, f, links, index, "2100")  # every worker changes
        stop, seen = threading.Event(), []
        clients = [threading.Thread(target=load, args=(router.address, stop, seen), daemon=True)
                   for _ in range(CLIENTS)]
        for c in clients:
            c.start()
        time.sleep(1)
        wall = inv(work, "deploy", "--group", "workers", "--serial", "2", "--quiet")
        time.sleep(1)
        stop.set()
        for c in clients:
            c.join(60)
        ok = sorted(x for x in seen if x is not None)
        pct = lambda p: round(ok[max(int(-(-p * len(ok) // 100)), 1) - 1], 4) if ok else None  # noqa: E731
        return {"workers": WORKERS, "serial": 2, "clients": CLIENTS, "wall_s": round(wall, 1),
                "served": len(ok), "failed": len(seen) - len(ok), "p50_s": pct(50), "p99_s": pct(99)}
    finally:
        if index:
            index.stop()
        f.down()


def markdown(r: dict) -> str:
    return "\n".join([
        MARK, "## A rolling deploy behind the router", "",
        f"{r['workers']} SGLang workers (the simulator, 1 s start) behind the real sglang-router 0.3.2, every worker "
        f"changed and restarted, `inv deploy --group workers --serial {r['serial']}`, while {r['clients']} "
        "closed-loop clients sent /generate (16 tokens) through the router, retries off.", "",
        "| workers | serial | wall time (s) | requests served | failed | p50 (s) | p99 (s) |",
        "|---|---|---|---|---|---|---|",
        f"| {r['workers']} | {r['serial']} | {r['wall_s']} | {r['served']} | {r['failed']} | {r['p50_s']} | "
        f"{r['p99_s']} |", "",
        f"Measured {time.strftime('%Y-%m-%d')}; reproduce with `.venv/bin/python bench/rolling.py` (as root, "
        "nothing else running).", END])


def main() -> None:
    result = measure()
    print(json.dumps(result, indent=1))
    (HERE / "rolling.json").write_text(json.dumps(result, indent=1) + "\n")
    section = markdown(result)
    (HERE / "rolling.md").write_text(section + "\n")
    bench = ROOT / "BENCHMARKS.md"
    text = bench.read_text()
    text = (text[:text.index(MARK)] + section + text[text.index(END) + len(END):]) if MARK in text \
        else text.rstrip() + "\n\n" + section + "\n"
    bench.write_text(text)


if __name__ == "__main__":
    main()
