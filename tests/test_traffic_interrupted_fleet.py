"""A --traffic capture on a sandbox host cut short, by Ctrl-C or by the controller killed outright
(kill -9 of `inv`): the server's request dump is turned off and the sample removed (and Ctrl-C
never stopped the server: the capture comes before the GPU window)."""
import os
import subprocess
import sys
import time

import pytest

from support import ROOT
from support.daytwo import Load
from support.spec_tune import LOAD
from support.traffic import ADMIN, KEY, PRODUCTION, dump_folders, inventory, samples_left

pytestmark = pytest.mark.fleet


def test_ctrl_c_mid_capture_turns_the_dump_off_and_removes_the_sample(sandbox):
    h = sandbox.reset("t2")
    inv = inventory(sandbox, "t2", admin_api_key=ADMIN)  # the capture works only with the admin key
    assert sandbox.inv("deploy", "--host", "t2", inventory=inv).returncode == 0
    with Load([h.address], KEY, limit=60, texts=PRODUCTION, clients=1, max_new_tokens=8):
        status, out = sandbox.interrupt("spec-tune", "--host", "t2", "--traffic", "100000", *LOAD, inventory=inv,
                                        when=lambda lines: any("requests dumped" in line for line in lines))
    assert status == 130 and "interrupted" in out and "requests dumped" in out, out[-3000:]
    assert samples_left(h) == [], out[-3000:]
    assert dump_folders(h)[-1] == "''", dump_folders(h)
    # the server was never stopped: the capture comes before the GPU window
    assert h.run("systemctl", "is-active", "sglang", check=False).stdout.strip() == "active"


def test_a_controller_killed_mid_capture_leaves_no_dump_on_and_no_sample(sandbox):
    """kill -9 of `inv`: no finally of the controller's runs; the agent sees its connection go."""
    h = sandbox.reset("t4")
    inv = inventory(sandbox, "t4")
    assert sandbox.inv("deploy", "--host", "t4", inventory=inv).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "spec-bench", "--host", "t4", "--traffic", "100000",
                             "--concurrency", "1", "--requests", "4"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, **sandbox.login_env(),
                                                           "SPECOPS_INVENTORY": str(inv)})
    with Load([h.address], KEY, limit=60, texts=PRODUCTION, clients=1, max_new_tokens=8):
        for line in proc.stdout:
            if "the request dump of sglang is on" in line:
                break
        time.sleep(2)
        assert [p for p in samples_left(h) if p.endswith("/d0")], "no capture under way"
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (samples_left(h) or dump_folders(h)[-1] != "''"):
            time.sleep(0.5)
    assert samples_left(h) == [] and dump_folders(h)[-1] == "''", (samples_left(h), dump_folders(h)[-3:])
