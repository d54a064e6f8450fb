"""Stopping a server that is serving: SGLang 0.5.23 drains on SIGTERM (it keeps serving, new
requests too, until none is left), so a stop under load runs to systemd's TimeoutStopSec; a stop
that need not drain sets SGLang's own SGL_FORCE_SHUTDOWN in the running server, which then exits
at its next look (sandbox/sglang_sim does both as tokenizer_manager.sigterm_watchdog does)."""
import re
import time

import pytest

from sandbox.provision import sandbox_service
from sandbox.routed import Load
from support.files import load_json

pytestmark = pytest.mark.fleet
PORT = 30000
KEY = "stop-key-1"  # a server beyond loopback needs one


def journal(h):
    return h.run("journalctl", "-u", "sglang", "-o", "cat", "--no-pager").stdout


def test_a_stop_under_load_is_reported_killed_at_its_timeout_and_one_that_need_not_drain_is_quick(sandbox):
    """Issue 23 item 9."""
    h = sandbox.reset("t5")
    knobs = {"SGLANG_SIM_STARTUP_DELAY": "0", "SGLANG_SIM_TOK_S": "20"}  # 400 tokens: 20 s a request
    svc = sandbox_service(bind="0.0.0.0", api_key=KEY, timeout_stop_sec=8, env=knobs)
    inv = sandbox.inventory({"t5": {"services": [svc]}})
    res = sandbox.inv("deploy", "--host", "t5", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]
    with Load(h.address, PORT, KEY, clients=4, max_new_tokens=400):
        res = sandbox.inv("stop", "--host", "t5", inventory=inv)
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-1000:]
    killed = re.search(r"sglang: did not exit on SIGTERM: systemd killed it at TimeoutStopSec, "
                       r"after ([\d.]+)s \(result 'timeout'\)", out)
    assert killed and 8 <= float(killed.group(1)) < 15, out[-3000:]
    assert ("sglang: still enabled: a reboot starts it again (`inv stop --host t5 --service sglang --disable` keeps "
            "it stopped)") in out, out[-3000:]
    log = journal(h)
    assert "SIGTERM received. Draining requests" in log, log[-3000:]
    assert re.search(r"Remaining number of requests [1-9]", log), log[-3000:]

    # Started again, then changed with --no-drain (the user asked for a quick stop): under the same
    # load its server exits without waiting for its requests.
    assert sandbox.inv("deploy", "--host", "t5", inventory=inv).returncode == 0
    quick = sandbox.inventory({"t5": {"services": [sandbox_service(bind="0.0.0.0", api_key=KEY, timeout_stop_sec=8,
                                                                   env={**knobs, "SGLANG_SIM_TOK_S": "21"})]}})
    with Load(h.address, PORT, KEY, clients=4, max_new_tokens=400):
        time.sleep(1)  # every client's request is in flight
        t0 = time.monotonic()
        res = sandbox.inv("deploy", "--host", "t5", "--no-drain", inventory=quick)
        took = time.monotonic() - t0
    out = res.stdout
    print(f"\n--no-drain deploy under load: {took:.1f} s")
    assert res.returncode == 0, out[-3000:]
    assert "result 'timeout'" not in out, out[-3000:]
    assert "sglang: need not drain: told to exit at SIGTERM without waiting for its requests" in out, out[-3000:]
    assert "force shutdown flag set. Force exiting." in journal(h)

    # Issue 38: stop --disable keeps a reboot from starting it again; a deploy enables and starts it.
    res = sandbox.inv("stop", "--host", "t5", "--disable", inventory=quick)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]
    assert "sglang: disabled: a reboot leaves it stopped (`inv deploy --host t5` enables and starts it)" in res.stdout
    assert h.run("systemctl", "is-enabled", "sglang", check=False).stdout.strip() == "disabled"
    res = sandbox.inv("deploy", "--host", "t5", inventory=quick)
    assert res.returncode == 0 and "service sglang: changed (enable" in res.stdout, res.stdout[-3000:]
    assert h.run("systemctl", "is-enabled", "sglang", check=False).stdout.strip() == "enabled"


def test_a_single_node_unit_that_crashes_while_being_stopped_stays_failed(sandbox):
    """Issue 24 item 5.  Only a rank of a multi-node service has a failure during its own stop
    cleared (its peer went first: test_multinode_fleet.py); a single-node server that crashes as it
    is stopped failed by itself, and stays "failed" for status to show, and stop says so."""
    h = sandbox.reset("t5")
    svc = sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "0", "SGLANG_SIM_STOP_EXIT": "1"})
    inv = sandbox.inventory({"t5": {"services": [svc]}})
    res = sandbox.inv("deploy", "--host", "t5", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]
    report = sandbox.tmp / "stop.json"
    res = sandbox.inv("stop", "--host", "t5", "--json", str(report), inventory=inv)
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + res.stderr[-1000:]  # stopped, its GPU memory freed
    assert re.search(r"^t5 .*sglang: its run ended with a failure while being stopped \(result 'exit-code'\): "
                     r"left \"failed\"", out, re.M), out[-3000:]
    assert "failed state cleared" not in out and "result 'timeout'" not in out, out[-3000:]
    assert "an exception while shutting down" in journal(h)
    assert h.run("systemctl", "is-failed", "sglang", check=False).stdout.strip() == "failed"
    notes = load_json(report)["hosts"]["t5"]["notes"]
    assert "sglang: failed while being stopped (result 'exit-code'); left \"failed\"" in notes, notes
    status = sandbox.inv("status", "--host", "t5", inventory=inv)
    assert re.search(r"^t5\s+sglang\s+failed/failed\s", status.stdout, re.M), status.stdout[-3000:]
