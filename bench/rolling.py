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

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench import sections  # noqa: E402
from sandbox import fleet, peerlink, pkgindex, provision, routed  # noqa: E402

SITE = fleet.Site("sor", "192.168.239", Path("/var/lib/specops-bench-rolling"))
MARK, END = sections.markers("rolling")
WORKERS, PORT, CLIENTS = 10, 30010, 16
KEY = "bench-router-key"  # a router beyond loopback needs one


def inv(work: Path, *args) -> float:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, text=True, capture_output=True,
                         env={**os.environ, "SPECOPS_INVENTORY": str(work)}, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"inv {' '.join(args)} failed:\n{res.stdout[-4000:]}\n{res.stderr[-2000:]}")
    return time.perf_counter() - t0


def measure() -> dict:
    f = fleet.Fleet([f"r{i}" for i in range(1, WORKERS + 2)], layers=[provision.layer("gpubox")], site=SITE).up()
    index = None
    try:
        provision.write_known_hosts(f)
        index = pkgindex.Index(f.site).start()
        workers, router = f.hosts[:WORKERS], f.hosts[WORKERS]
        links = {h.name: peerlink.up(router, h)[1] for h in workers}
        work = Path(tempfile.mkdtemp(prefix="specops-rolling-"))

        def write(tok_s):
            doc = routed.inventory(workers, router, links, index, PORT, KEY, knobs={"SGLANG_SIM_TOK_S": tok_s},
                                   router_extra={"retries": False})
            (work / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
            return work
        inv(write("2000"), "deploy", "--all", "--quiet")
        write("2100")  # every worker changes
        with routed.Load(router.address, PORT, KEY, clients=CLIENTS) as load:
            wall = inv(work, "deploy", "--group", "workers", "--serial", "2", "--quiet")
        return {"workers": WORKERS, "serial": 2, "clients": CLIENTS, "wall_s": round(wall, 1),
                **{k: v for k, v in load.summary().items() if k != "errors"}}
    finally:
        if index:
            index.stop()
        f.down()


def markdown(r: dict) -> str:
    ms = lambda s: f"{s * 1000:.0f}" if s is not None else "-"  # noqa: E731
    return "\n".join([
        MARK, "## A rolling deploy behind the router", "",
        f"{r['workers']} SGLang workers (the simulator, 1 s start) behind the real sglang-router 0.3.2, every worker "
        f"changed and restarted, `inv deploy --group workers --serial {r['serial']}`, while {r['clients']} "
        "closed-loop clients sent /generate (16 tokens) through the router, retries off.", "",
        "| workers | serial | wall time (s) | requests served | failed | p50 (ms) | p99 (ms) |",
        "|---|---|---|---|---|---|---|",
        f"| {r['workers']} | {r['serial']} | {r['wall_s']} | {r['served']} | {r['failed']} | {ms(r['p50_s'])} | "
        f"{ms(r['p99_s'])} |", "",
        f"Measured {time.strftime('%Y-%m-%d')}; reproduce with `.venv/bin/python bench/rolling.py` (as root, "
        "nothing else running).", END])


def main() -> None:
    result = measure()
    sections.publish("rolling", result, markdown(result))


if __name__ == "__main__":
    main()
