"""Waiting for a big model: the ready-wait follows the server's progress (its own log lines,
its memory), fails a start that stalls after the stall timeout, and keeps a ceiling.

Minutes become seconds, keeping the ratios of the real case: a 12-minute start that keeps
logging, a stall timeout of a few minutes, the old fixed 10-minute timeout."""
import re
import threading
import time

import pytest

from sandbox.provision import sandbox_service
from support.files import load_json

pytestmark = pytest.mark.fleet


def deploy(sandbox, svc, host):
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    t0 = time.monotonic()
    res = sandbox.inv("deploy", "--host", host, "--json", str(report),
                      inventory=sandbox.inventory({host: {"services": [svc]}}))
    return res, load_json(report)["hosts"][host], time.monotonic() - t0


def chatty(load, shards, stall_after=None, **verify):
    env = {"SGLANG_SIM_LOAD_DELAY": str(load), "SGLANG_SIM_SHARDS": str(shards), "SGLANG_SIM_STARTUP_DELAY": "0"}
    if stall_after is not None:
        env["SGLANG_SIM_STALL_AFTER"] = str(stall_after)
    return sandbox_service(env=env, verify=verify)


def test_a_long_start_that_keeps_logging_is_waited_for_and_shown(sandbox):
    """12 "minutes" of loading with a 5-"minute" stall timeout: verified, and the controller saw
    the server's own phases.  With the old fixed 10-"minute" deadline, the same start fails."""
    sandbox.reset("t3")
    res, rep, _ = deploy(sandbox, chatty(12, 24, stall_timeout=5, timeout=120), "t3")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "sglang verified" in rep["notes"]
    # The count moved while we waited, though SGLang's bar ends no line until the load is done
    # (the simulator draws it with SGLang's tqdm and format, from a spawned child as its scheduler).
    seen = [int(n) for n in re.findall(r"elapsed; loading weights (\d+)/24", res.stdout)]
    assert len(set(seen)) >= 3 and seen == sorted(seen) and 0 < seen[0] < 24, res.stdout[-3000:]
    assert re.search(r"elapsed; (capturing target verify CUDA graphs|capturing CUDA graphs: batch size \d+ \(\d+/\d+\)"
                     r"|target verify CUDA graphs captured)", res.stdout), res.stdout[-3000:]

    # 23 shards (a changed unit, so it restarts) under the old fixed deadline, scaled: it fails.
    res, rep, _ = deploy(sandbox, chatty(12, 23, stall_timeout=5, timeout=10), "t3")
    assert res.returncode == 1
    assert "not ready after 10s" in rep["error"] and "the ceiling (verify.timeout)" in rep["error"]


def journal_tail(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("journal tail:"))
    return [line.split("   | ", 1)[1] for line in lines[start + 1:] if "   | " in line]


def test_a_start_that_stalls_fails_after_the_stall_timeout_with_the_journal(sandbox):
    """Loading hangs after 5 of 20 shards (alive, silent): failed after about the stall timeout,
    long before the ceiling, naming the true last count (SGLang's bar ends no line), with the
    journal tail that shows where it hung; a first deploy is undone.  Again after a run that was
    ready and then stopped: the tail is this start's lines only, each bar at its last state."""
    h = sandbox.reset("t4")
    stalling = chatty(10, 20, stall_after=5, stall_timeout=4, timeout=300)
    res, rep, took = deploy(sandbox, stalling, "t4")
    assert res.returncode == 1, res.stdout[-3000:]
    assert "stalled: no progress for" in rep["error"] and "last: loading weights 5/20" in rep["error"], rep["error"]
    assert "Completed | 5/20 [" in "\n".join(journal_tail(res.stdout))
    assert "rolled back to the state before this deploy (no earlier release to verify)" in rep["error"]
    assert took < 60  # the ceiling is 300 s
    assert not h.path("/etc/systemd/system/sglang.service").exists()  # a first deploy: undone
    assert h.run("systemctl", "is-active", "sglang", check=False).stdout.strip() != "active"

    res, _, _ = deploy(sandbox, chatty(1, 2, stall_timeout=4, timeout=60), "t4")
    assert res.returncode == 0, res.stdout[-3000:]
    res, rep, _ = deploy(sandbox, stalling, "t4")
    assert res.returncode == 1 and "last: loading weights 5/20" in rep["error"], rep["error"]
    tail = journal_tail(res.stdout)
    bars = [line for line in tail if "Completed |" in line]
    assert len(bars) == 1 and "Completed | 5/20 [" in bars[0], tail
    assert any("Load weight begin" in line for line in tail), tail
    assert not [line for line in tail if "ready to roll" in line or "2/2" in line or "sigterm" in line.lower()], tail
    assert re.search(r"; rolled back to \S+, verified$", rep["error"]), rep["error"]


def test_a_server_killed_while_starting_fails_verify(sandbox):
    """While it waits, the ready-wait asks systemd again only when the unit's main process is
    gone.  A server killed mid-start fails verify ("the server exited"), before systemd's restart
    (RestartSec=5) starts another that would be ready in time and hide the death."""
    h = sandbox.reset("t5")
    done = {}
    job = threading.Thread(target=lambda: done.update(
        zip(("res", "rep", "took"), deploy(sandbox, sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "12"}), "t5"))))
    job.start()
    deadline, pid = time.monotonic() + 60, "0"
    while pid == "0" and time.monotonic() < deadline:
        time.sleep(0.2)
        pid = h.run("systemctl", "show", "-p", "MainPID", "--value", "sglang", check=False).stdout.strip() or "0"
    assert pid != "0", "the server never started"
    time.sleep(3)  # well into the ready-wait
    h.run("kill", "-KILL", pid)
    job.join(180)
    assert done["res"].returncode == 1, done["res"].stdout[-3000:]
    assert "the server exited" in done["rep"]["error"], done["rep"]["error"]
    # what systemd said of the run is part of its tail (PID 1's line, which carries the run's INVOCATION_ID)
    assert any("Main process exited, code=killed" in line for line in journal_tail(done["res"].stdout)), \
        done["res"].stdout[-3000:]
    assert done["rep"]["verify"][0]["health_statuses"], done["rep"]["verify"]  # it died while being waited for
