"""A --traffic run's sandbox host (test_traffic_fleet.py, test_traffic_interrupted_fleet.py): its service,
whose simulated draft guesses one family of prompts badly (KNOBS), production's prompts of that
family, the dump folders the server's journal names, and the samples left on the host."""
import json

import yaml

from sandbox.provision import sandbox_service

KEY = "sk-traffic-test-key"
ADMIN = "sk-traffic-admin-key"  # with it, SGLang takes only it on /configure_logging
FAMILY = {"kotlin": 0.3}
KNOBS = {"SGLANG_SIM_STARTUP_DELAY": "0", "SGLANG_SIM_TOK_S": "200", "SGLANG_SIM_DRAFT_COST": "0.15",
         "SGLANG_SIM_ACCEPT_RATE": "0.8", "SGLANG_SIM_FAMILY_ACCEPT": json.dumps(FAMILY)}
SPACE = {"num_steps": [1, 2, 3, 5], "eagle_topk": [1], "num_draft_tokens": [2, 3, 4, 6]}
PRODUCTION = [f"Port this Kotlin coroutine to plain threads, case {i}: suspend fun load{i}() = fetch({i})"
              for i in range(7)]
SAMPLES = "/var/lib/specops/traffic"


def inventory(sandbox, name, **over):
    """hosts.yml, and host_vars/NAME.yml holding the service (where --apply writes the winner)."""
    inv = sandbox.inventory({name: {}})
    svc = sandbox_service(**{"env": KNOBS, "tune": SPACE, "bind": "0.0.0.0", "api_key": KEY, **over})
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump({"services": [svc]}, sort_keys=False))
    return inv


def dump_folders(h):
    """The dump folders the server was told, in order, from its journal ("Config logging: ...")."""
    out = h.run("journalctl", "-u", "sglang", "--no-pager", "-o", "cat", check=False).stdout
    return [line.split("dump_requests_folder=", 1)[1].split(",", 1)[0] for line in out.splitlines()
            if "Config logging: obj=" in line]


def samples_left(h):
    return h.run("sh", "-c", f"find {SAMPLES} -mindepth 1 2>/dev/null", check=False).stdout.split()
