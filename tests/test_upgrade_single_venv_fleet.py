"""A host deployed into the one venv, as before stacks (the gpubox layer's /opt/sglang/venv),
moves to its own stack on its next deploy: built beside, the unit pointed at it, one restart."""
import pytest

from sandbox import provision
from support.hosts import unit_prop
from support.stacks import info, run, venv_for

pytestmark = pytest.mark.fleet


def test_a_host_with_todays_single_venv_moves_to_a_stack_with_one_restart(sandbox, pkg_index):
    """A box deployed into the one venv (the gpubox layer's /opt/sglang/venv, as before stacks)
    moves to its stack on its next deploy: built beside, the unit pointed at it, one restart."""
    h = sandbox.reset("t5")
    pins = {"services": [provision.sandbox_service()], "sglang": {"version": "0.5.23"},
            "package_index": f"{pkg_index.url}/simple"}
    res = sandbox.inv("deploy", "--host", "t5", inventory=sandbox.inventory({"t5": pins}))  # venv: the layer's
    assert res.returncode == 0, res.stdout[-3000:]
    started = unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic")
    res, rep = run(sandbox, "t5", pins)  # no venv: the stack
    assert res.returncode == 0, res.stdout[-3000:]
    assert res.stdout.count("handler: restart sglang") == 1, res.stdout
    assert unit_prop(h, "sglang", "ExecMainStartTimestampMonotonic") != started
    assert f"{venv_for(pins)}/bin/python" in h.path("/etc/systemd/system/sglang.service").read_text()
    assert info(h)["model_code_file"].startswith(venv_for(pins) + "/")
    assert h.path("/opt/sglang/venv/bin/python").exists()  # the old venv is the user's to remove
    res, rep = run(sandbox, "t5", pins)
    assert res.returncode == 0 and rep["changed"] == 0, res.stdout[-3000:]
