"""The benchmark of the benchmark: what spec-bench's load client itself costs on the host.

    python bench/loadclient.py                 # writes bench/loadclient.md and its section of BENCHMARKS.md

spec-bench's client runs on the host it measures, beside the server, so its own CPU is taken
from the server's host.  This boots one sandbox host (its own site), deploys the simulated
server with a fast performance model (so the client, not the server, sets the pace), runs
`inv spec-bench` at concurrency 1, 8 and 32, and reports the client's CPU seconds (the agent
process's user + system time over each level: `client_cpu_s`) per 1,000 requests.
"""
from __future__ import annotations

import argparse
import json
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
from sandbox import fleet, provision  # noqa: E402

SITE = fleet.Site("soc", "192.168.238", Path("/var/lib/specops-bench-client"))
MARK, END = sections.markers("loadclient")
KNOBS = {"SGLANG_SIM_STARTUP_DELAY": "1", "SGLANG_SIM_TOK_S": "20000", "SGLANG_SIM_ACCEPT_LENGTH": "3.0"}


def measure(requests: int, max_new_tokens: int, levels: str) -> dict:
    f = fleet.Fleet(["c1"], layers=[provision.layer("gpubox")], site=SITE).up()
    try:
        provision.write_known_hosts(f)
        h = f.hosts[0]
        work = Path(tempfile.mkdtemp(prefix="specops-loadclient-"))
        svc = provision.sandbox_service(env=KNOBS)
        doc = {"all": {"vars": {"venv": provision.VENV},
                       "hosts": {h.name: {**provision.host_vars(h), "services": [svc]}}}}
        (work / "hosts.yml").write_text(yaml.safe_dump(doc))
        env = {**os.environ, "SPECOPS_INVENTORY": str(work)}

        def inv(*args):
            res = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env, text=True,
                                 capture_output=True, timeout=1800)
            if res.returncode != 0:
                raise SystemExit(f"inv {' '.join(args)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
            return res
        inv("deploy", "--host", h.name, "--quiet")
        t0 = time.perf_counter()
        inv("spec-bench", "--host", h.name, "--concurrency", levels, "--requests", str(requests),
            "--max-new-tokens", str(max_new_tokens), "--json", str(work / "bench.json"))
        wall = time.perf_counter() - t0
        perf = json.loads(h.run("cat", "/var/lib/specops/releases/current/perf.json").stdout)["sglang"]
        return {"requests": requests, "max_new_tokens": max_new_tokens, "wall_s": round(wall, 1),
                "levels": [{"concurrency": lv["concurrency"], "client_cpu_s": lv["figures"]["client_cpu_s"],
                            "requests": lv["figures"]["requests"], "failed": lv["figures"]["failed"],
                            "output_tok_s": lv["figures"]["output_tok_s"],
                            "cpu_s_per_1000": round(
                                1000 * lv["figures"]["client_cpu_s"] / lv["figures"]["requests"], 3)}
                           for lv in perf["spec"]]}
    finally:
        f.down()


def markdown(result: dict) -> str:
    lines = [MARK, "## spec-bench's load client: its own cost on the host", "",
             f"One sandbox host, the simulated server with a fast performance model (so the client sets the pace), "
             f"{result['requests']} streamed requests of {result['max_new_tokens']} tokens per level; the client's "
             "CPU is the agent process's user + system time over the level (`client_cpu_s` in perf.json). "
             f"Whole `inv spec-bench` run: {result['wall_s']} s.", "",
             "| concurrency | requests | failed | tok/s | client CPU s | CPU s per 1,000 requests |",
             "|---|---|---|---|---|---|"]
    for lv in result["levels"]:
        lines.append(f"| {lv['concurrency']} | {lv['requests']} | {lv['failed']} | {lv['output_tok_s']:.0f} | "
                     f"{lv['client_cpu_s']:.2f} | {lv['cpu_s_per_1000']:.2f} |")
    lines += ["", f"Measured {time.strftime('%Y-%m-%d')}; reproduce with `.venv/bin/python bench/loadclient.py` "
              "(as root, nothing else running).", END]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,8,32")
    args = ap.parse_args()
    result = measure(args.requests, args.max_new_tokens, args.concurrency)
    sections.publish("loadclient", result, markdown(result))


if __name__ == "__main__":
    main()
