"""A service across two sandbox hosts: rank 0 on t1, rank 1 on t2, joined over a link straight
between their namespaces (sandbox/peerlink.py).  The simulator does what matters of SGLang's
multi-node start: rank 0 is not ready until every rank has joined at --dist-init-addr, only
rank 0 serves HTTP, and a rank that goes takes the others down (a NCCL failure)."""
import contextlib
import re
import time

import pytest

from sandbox import peerlink
from sandbox.provision import sandbox_service
from support.files import load_json

pytestmark = pytest.mark.fleet


@contextlib.contextmanager
def spanning(sandbox, over):
    """t1 (rank 0) and t2 (rank 1), freshly booted and linked, with a service across both."""
    t1, t2 = sandbox.reset("t1"), sandbox.reset("t2")
    rank0_address, _ = peerlink.up(t1, t2)
    try:
        svc = sandbox_service(nodes=["t1", "t2"], tp=2, **over)
        inv = sandbox.inventory({"t1": {"services": [svc], "node_address": rank0_address}, "t2": {"services": [svc]}})
        yield t1, t2, inv, rank0_address
    finally:
        peerlink.down(t1, t2)


@pytest.fixture
def two_nodes(sandbox):
    # Rank 0 takes 3 s to stop and rank 1 up to 30 s, so rank 1 is being stopped when rank 0 goes
    # (unless its stop comes 3 s later), and exits with a failure, as a lost peer's NCCL error does.
    with spanning(sandbox, {"env": {"SGLANG_SIM_STARTUP_DELAY": "1", "SGLANG_SIM_STOP_SECONDS": "3,30"}}) as nodes:
        yield nodes


def deploy(sandbox, inv, *args):
    report = sandbox.tmp / f"d{time.monotonic_ns()}.json"
    res = sandbox.inv("deploy", "--json", str(report), *args, inventory=inv, timeout=600)
    return res, (load_json(report)["hosts"] if report.exists() else {})


def started(h):
    return h.run("systemctl", "show", "sglang", "-p", "ExecMainStartTimestampMonotonic").stdout


def test_a_two_node_service_comes_up_verifies_through_rank_0_and_stops_on_both(sandbox, two_nodes):
    t1, t2, inv, addr = two_nodes
    res, rep = deploy(sandbox, inv, "--host", "t1")  # its other node comes along
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-1000:]
    assert "sglang spans t1, t2: t2 included" in res.stderr
    assert "sglang verified" in rep["t1"]["notes"] and "sglang verified" in rep["t2"]["notes"]
    assert "/generate " in res.stdout and "/health 200 (the API is rank 0's)" in res.stdout
    units = {h.name: h.run("systemctl", "cat", "sglang").stdout for h in (t1, t2)}
    for rank, h in enumerate((t1, t2)):
        assert f'"--nnodes" "2" "--node-rank" "{rank}" "--dist-init-addr" "{addr}:50000"' in units[h.name]
    log = t1.run("journalctl", "-u", "sglang", "-o", "cat", "--no-pager").stdout
    assert "Node rank 1 joined" in log
    st = sandbox.inv("status", "--host", "t1", inventory=inv)
    assert st.returncode == 0 and "sglang (rank 0 of 2)" in st.stdout and "sglang (rank 1 of 2)" in st.stdout, \
        st.stdout + st.stderr
    # Idempotent: nothing changes, nothing restarts.
    before = (started(t1), started(t2))
    res, rep = deploy(sandbox, inv, "--host", "t2")
    assert res.returncode == 0, res.stdout[-3000:]
    assert {n: [c for c in h["changes"] if c["changed"]] for n, h in rep.items()} == {"t1": [], "t2": []}
    assert (started(t1), started(t2)) == before
    # Stop acts on every node and proves each node's GPUs free.
    res = sandbox.inv("stop", "--host", "t2", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]
    lines = [next(l for l in res.stdout.splitlines() if l.startswith(h + " ") and "sglang: stopped in" in l)
             for h in ("t1", "t2")]
    # The rank that lost its peer while being stopped ended "failed"; stop says so and leaves it stopped.
    assert re.search(r"^t2 .*its run ended with exit-code while being stopped.*; failed state cleared$",
                     res.stdout, re.M), res.stdout[-3000:]
    # Each node's GPUs proven free (a GPU memory left would have failed the stop).
    assert all("freed GPU 0:" in line for line in lines), lines
    assert [h.run("systemctl", "is-active", "sglang", check=False).stdout.strip() for h in (t1, t2)] == \
        ["inactive", "inactive"]


def test_a_rank_that_hangs_past_its_stop_timeout_stays_failed(sandbox):
    """Stop clears only a failure the stop caused by itself: a rank that hung (its peer gone, it
    waits in a collective; it ignores SIGTERM for 30 s) and was killed at TimeoutStopSec stays
    "failed", and stop says so, for status to show."""
    knobs = {"SGLANG_SIM_STARTUP_DELAY": "1", "SGLANG_SIM_STOP_SECONDS": "0,30", "SGLANG_SIM_PEER_LOSS": "hang"}
    with spanning(sandbox, {"timeout_stop_sec": 8, "env": knobs}) as (t1, t2, inv, _):
        res, _ = deploy(sandbox, inv, "--host", "t1")
        assert res.returncode == 0, res.stdout[-4000:]
        res = sandbox.inv("stop", "--host", "t1", inventory=inv)
        assert re.search(r'^t2 .*sglang: failed while being stopped \(timeout\); left "failed"$', res.stdout, re.M), \
            res.stdout[-3000:]
        assert "failed state cleared" not in res.stdout, res.stdout[-3000:]
        assert [h.run("systemctl", "is-active", "sglang", check=False).stdout.strip() for h in (t1, t2)] == \
            ["inactive", "failed"]
        # Stopped again: the failure is not this stop's, and stop says so.
        res = sandbox.inv("stop", "--host", "t1", inventory=inv)
        assert re.search(r"^t2 .*sglang: was already failed before this stop \(result 'timeout'\), not by it",
                         res.stdout, re.M), res.stdout[-3000:]
        assert not re.search(r"^t1 .*failed before", res.stdout, re.M)


def test_a_lost_rank_fails_rank_0_with_a_clear_message(sandbox, two_nodes):
    t1, t2, inv, addr = two_nodes
    res, _ = deploy(sandbox, inv, "--host", "t1")
    assert res.returncode == 0, res.stdout[-3000:]
    pid = t2.run("systemctl", "show", "sglang", "-p", "MainPID", "--value").stdout.strip()
    t2.run("kill", "-9", pid)
    time.sleep(1)
    res = sandbox.inv("verify", "--host", "t1", inventory=inv)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "node rank 1 left the communicator" in out, out[-3000:]
    # Status says so too, also once systemd has brought both ranks back.
    st = sandbox.inv("status", "--host", "t1", inventory=inv)
    print("\nstatus after the lost rank:\n" + st.stdout)
    assert "CRASHED: systemd restarted it 1 time(s) since its start" in st.stdout, st.stdout


def test_a_stopped_rank_fails_rank_0s_verify_at_once_naming_it(sandbox):
    """Rank 1 stopped by hand: rank 0 loses its peer, systemd starts it again, and it waits for
    rank 1 to join, for ever, its /health 503.  Verify of rank 0 fails within seconds, naming the
    node, the rank and its unit's state, not after its timeout with a wrong cause ("not ready ...
    loading weights").  A second stop of a rank left failed says it was failed before it."""
    knobs = {"SGLANG_SIM_STARTUP_DELAY": "1"}
    with spanning(sandbox, {"env": knobs, "verify": {"timeout": 90, "stall_timeout": 90}}) as (t1, t2, inv, _):
        res, _ = deploy(sandbox, inv, "--host", "t1")
        assert res.returncode == 0, res.stdout[-4000:]
        first = t1.run("systemctl", "show", "sglang", "-p", "InvocationID", "--value").stdout.strip()
        t2.run("systemctl", "stop", "sglang")
        deadline = time.monotonic() + 60  # rank 0 crashes with its peer gone and is started again
        while time.monotonic() < deadline:
            now = [t1.run("systemctl", "show", "sglang", "-p", p, "--value").stdout.strip()
                   for p in ("InvocationID", "SubState")]
            if now[0] != first and now[1] == "running":
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"rank 0 was not started again: {now}")
        t0 = time.monotonic()
        res = sandbox.inv("verify", "--host", "t1", inventory=inv, timeout=300)
        took = time.monotonic() - t0
        assert res.returncode == 1, res.stdout[-3000:]
        assert re.search(r"^t1 .*FAILED rank 1 on t2 is down \(unit sglang is inactive/dead\b.*\): this rank 0 cannot "
                         r"be ready without it$", res.stdout, re.M), res.stdout[-3000:]
        assert took < 30, took  # its timeout is 90 s
