"""Ctrl-C mid-run still leaves a recap and --json: which hosts finished, which were cut short
(doing what), which never started; redacted as every report is (the fleet test:
test_interrupted_report_fleet.py)."""
import io
import json
import os
import signal
import threading
import time

import pytest

from specops.inventory import Host
from specops.output.report import Interrupted, Redactor, Reporter, recap
from specops.run import Options, run_hosts

SECRET = "hf_s3cret\"value"
SVC = {"name": "sglang", "model_path": "/m", "env_secret": {"HF_TOKEN": SECRET}}


@pytest.mark.parametrize("to_thread", [False, True], ids=["to-the-process", "to-a-host-s-thread"])
def test_a_ctrl_c_mid_run_reports_every_host_as_far_as_known(tmp_path, to_thread):
    """The kernel gives a process's SIGINT to any of its threads: to a host's, the main thread must
    still act on it at once (it waited in one long wait before, until that host's run ended: seen
    red under xdist, and always with the signal sent to the host's thread)."""
    hosts = [Host(n, {"services": [SVC]}) for n in ("a", "b", "c")]
    out = Reporter(Redactor(hosts), show_diff=False, stream=io.StringIO())
    a_done, a_report = threading.Event(), []

    def body(run):
        if run.host.name == "a":
            run.say(f"done with {SECRET}")
            a_report.append(run.report)
            a_done.set()
            return
        a_done.wait(5)
        deadline = time.monotonic() + 10  # bounds a broken test
        while not a_report[0].elapsed and time.monotonic() < deadline:
            time.sleep(0.01)  # until a's run has ended, not only its body
        run.report.doing = "Verify"  # as HostRun.call marks a request in flight
        run.say(f"waiting, token {SECRET}")
        if to_thread:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        else:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as a user's, to the process
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.01)  # the run passes the Ctrl-C on to this thread
        raise AssertionError("the Ctrl-C never reached this host's run")

    with pytest.raises(Interrupted) as cut:
        run_hosts(hosts, body, [], Options(serial=2), out)
    path = tmp_path / "r.json"
    assert recap(cut.value.reports, out, str(path), cut=True) == 0
    text = path.read_text()
    doc = json.loads(text)
    assert SECRET not in text and json.dumps(SECRET)[1:-1] not in text
    assert doc["interrupted"] is True
    hosts = doc["hosts"]
    assert hosts["a"]["status"] == "ok" and "interrupted" not in hosts["a"]
    assert hosts["b"]["status"] == "interrupted"
    assert hosts["b"]["interrupted"]["during"] == "Verify"
    assert hosts["b"]["interrupted"]["last_line"] == "waiting, token ***"
    assert hosts["b"]["interrupted"]["applied"] == []
    assert hosts["c"]["status"] == "not started"
    printed = out.stream.getvalue()
    assert "RECAP (interrupted)" in printed and "interrupted during Verify" in printed and SECRET not in printed


def test_a_normal_run_says_it_was_not_interrupted(tmp_path):
    hosts = [Host("a", {})]
    out = Reporter(Redactor(hosts), show_diff=False, stream=io.StringIO())
    path = tmp_path / "r.json"
    recap(run_hosts(hosts, lambda run: None, [], Options(), out), out, str(path))
    doc = json.loads(path.read_text())
    assert doc["interrupted"] is False and doc["hosts"]["a"]["status"] == "ok"


def test_the_recap_strips_what_a_host_said_of_terminal_escapes():
    hosts = [Host("a", {})]
    out = Reporter(Redactor(hosts), show_diff=False, stream=io.StringIO())
    (report,) = run_hosts(hosts, lambda run: run.report.notes.append("release \x1b]0;owned\x07x\x1b[2J"), [],
                          Options(), out)
    recap([report], out)
    assert "\x1b" not in out.stream.getvalue() and "release ]0;ownedx" in out.stream.getvalue()
