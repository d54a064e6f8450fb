"""`inv monitoring` as the tests without a fleet check it: the real promtool, the router fleet
whose configuration they write (fleet(); tests/conftest.py's `written` fixture writes it), and a
series labelled as the scrape labels it (scraped())."""
import shutil
import subprocess

import pytest
import yaml

from roles import VOCABULARY
from specops import inventory

SPEC = {"algorithm": "EAGLE3", "draft_model_path": "/m/draft", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
SG = {"name": "sglang", "model_path": "/m/llama", "served_model_name": "llama", "bind": "0.0.0.0", "port": 30001,
      "speculative": SPEC}
WATCHED = {"accept_fraction": 0.9, "for": "5m", "min_verify_rate": 0.1, "speedup_margin": 0.2}


def promtool(*args, cwd=None):
    if not shutil.which("promtool"):
        pytest.fail("promtool is missing: run scripts/setup.sh (Debian's prometheus package)")
    run = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def fleet(tmp_path):
    """Workers w1..w3 (w3 on IPv6, with its own watch), routers r (default metrics port) and r2
    (its own), a service across n0 and n1, and a service of w1 with its metrics off."""
    big = {"name": "big", "model_path": "/m/big", "tp": 2, "nodes": ["n0", "n1"], "bind": "0.0.0.0",
           "speculative": SPEC}
    router = {"name": "router", "kind": "router", "workers": {"group": "workers"}, "api_key": "rk-1"}
    doc = {"all": {"children": {
        "workers": {"hosts": {
            "w1": {"address": "10.0.0.1", "services": [SG, {"name": "plain", "model_path": "/m/p", "port": 30002,
                                                           "metrics": False}]},
            "w2": {"address": "10.0.0.2", "router_address": "10.9.0.2", "services": [SG]},
            "w3": {"address": "fd00::3", "services": [{**SG, "watch": WATCHED}]}}},
        "edge": {"hosts": {"r": {"address": "10.0.0.9", "services": [router]},
                           "r2": {"address": "10.0.0.10", "services": [{**router, "extra_args": [
                               "--prometheus-port", "29100"]}]}}},
        "big": {"vars": {"services": [big]}, "hosts": {"n0": {"address": "10.0.1.0"}, "n1": {"address": "10.0.1.1"}}},
    }}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    inv = inventory.load(tmp_path, VOCABULARY)
    # the monitoring role's var: true, or its settings; false or absent: no node_exporter
    inv.hosts["w1"].vars["monitoring"] = True
    inv.hosts["r"].vars["monitoring"] = {"textfile_dir": "/var/lib/prometheus/node-exporter", "refresh": "1min"}
    inv.hosts["w2"].vars["monitoring"] = False
    return inv


GROUPS = {"n0": "big", "r": "edge"}  # fleet()'s hosts' groups: the others are workers
# the labels SGLang 0.5.23 puts on each of its own series
OWN = {"model_name": "llama", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}


def scraped(name, host, job="sglang", **labels):
    """A series as the scrape labels it: the target's labels (targets.py) and the metric's own."""
    target = {"sglang": {"instance": f"{host}:30001", "role": "sglang", "service": "sglang", "served": "llama"},
              "node": {"instance": f"{host}:9100", "role": "node"}}[job]
    group = GROUPS.get(host, "workers")
    own = OWN if name.startswith("sglang:") else {}
    all_labels = {**target, **own, "job": job, "host": host, "group": group, **labels}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(all_labels.items())) + "}"
