"""A deploy (or another task) onto a sandbox host's stacks, which specops builds (the group var
venv: None), with its --json report; the stack a host's vars name; and what the simulator says
it imported (test_upgrade_fleet.py, test_upgrade_single_venv_fleet.py)."""
import json
import time

from specops.sglang import stack
from support.files import load_json


def venv_for(hv):
    return stack.venv_of(hv)


def run(sandbox, name, hv, *args, task="deploy", timeout=600):
    inv = sandbox.inventory({name: hv}, group_vars={"venv": None})
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    json_arg = ["--json", str(report)] if task != "releases" else []
    res = sandbox.inv(task, "--host", name, *args, *json_arg, inventory=inv, timeout=timeout)
    return res, (load_json(report)["hosts"][name] if report.exists() else None)


def info(h):
    return json.loads(h.run("curl", "-sf", "http://127.0.0.1:30000/model_info").stdout)
