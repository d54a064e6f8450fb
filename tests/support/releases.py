"""A sandbox host's release as the all-or-nothing fleet tests read it (test_all_or_nothing_fleet.py,
test_read_only_target_fleet.py): an inventory of a deploy's own, its first release deployed, the
release current, and what serves it (the unit file's bytes, the server's run and its arguments)."""
import json

from support.hosts import unit_prop
from support.site import run_inv

UNIT = "/etc/systemd/system/sglang.service"


def inventory(sandbox, name, hosts, group_vars=None):
    """An inventory of its own (Sandbox.inventory rewrites one path)."""
    import shutil
    path = sandbox.tmp / name
    shutil.copytree(sandbox.inventory(hosts, group_vars), path)
    return path


def current(h):
    return h.run("readlink", "/var/lib/specops/releases/current").stdout.strip()


def server_info(h):
    return json.loads(h.run("curl", "-sf", "http://127.0.0.1:30000/server_info").stdout)


def serving(h):
    """What serves, as the host shows it: the unit file's bytes, the server's run and its arguments."""
    active = unit_prop(h, "sglang", "ActiveState") == "active"
    return {"unit": h.run("sha256sum", UNIT).stdout.split()[0], "pid": unit_prop(h, "sglang", "MainPID"),
            "invocation": unit_prop(h, "sglang", "InvocationID"),
            "steps": server_info(h)["speculative_num_steps"] if active else None}


def first_release(sandbox, h, name, hosts, group_vars=None, **kw):
    one = inventory(sandbox, name, hosts, group_vars)
    res, _ = run_inv(sandbox, one, "deploy", "--host", h.name, **kw)
    assert res.returncode == 0, res.stdout[-3000:]
    return one, current(h), serving(h)
