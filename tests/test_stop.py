"""`inv stop` without the fleet: the unit stays enabled unless --disable, and stop says what a
reboot does to each service (issue 38: a reboot started a stopped server again, and nothing said
so).  The fleet test: test_stop_fleet.py."""
from types import SimpleNamespace

from invoke import Context

import tasks
from specops import cli, protocol
from specops.agent.services import units
from specops.flows import pipeline, rolling
from specops.output.report import HostReport
from specops.run import HostRun


def test_the_agent_disables_each_stopped_unit_only_when_asked_and_reports_its_state(monkeypatch):
    ran, state = [], {"sglang": "enabled"}

    """The state is what `systemctl is-enabled` reads from the links on disk: PID 1's UnitFileState
    still said "enabled" after `disable --no-reload` (seen on the fleet)."""
    def run_quiet(argv, timeout=None):
        ran.append(argv)
        if argv[:2] == ["systemctl", "disable"]:
            state[argv[-1]] = "disabled"
        return (0, state[argv[-1]] + "\n") if argv[:2] == ["systemctl", "is-enabled"] else (0, "")
    monkeypatch.setattr(units, "stop_unit", lambda ref, others=(), measure=True: protocol.StopReport(ref.name, 1.0))
    monkeypatch.setattr(units, "run_quiet", run_quiet)
    monkeypatch.setattr(units, "show", lambda name, *props: {"UnitFileState": "enabled"})  # PID 1, not reloaded
    monkeypatch.setattr(units, "_gpu", lambda: {})
    kept = units.stop(protocol.Stop(services=[protocol.UnitRef(name="sglang")]))
    assert kept.services[0].enabled == "enabled" and ran == [["systemctl", "is-enabled", "sglang"]]
    ran.clear()
    gone = units.stop(protocol.Stop(services=[protocol.UnitRef(name="sglang")], disable=True))
    # with systemd's reload (no --no-reload): a deploy reads PID 1's state to enable it again
    assert ran == [["systemctl", "disable", "--quiet", "sglang"], ["systemctl", "is-enabled", "sglang"]]
    assert gone.services[0].enabled == "disabled" and not gone.services[0].failures


class _Run:
    hint = HostRun.hint

    def __init__(self):
        self.said = []
        self.host = SimpleNamespace(name="t1")

    def say(self, text):
        self.said.append(text)

    def probe(self, *a, **k):
        pass


def test_stop_says_what_a_reboot_does(monkeypatch):
    asked = []
    monkeypatch.setattr(rolling, "out_of_routers", lambda run, body, names=None, back=True: body())

    def stop(run, names=None, disable=False):
        asked.append(disable)
        return protocol.StopResult(services=[protocol.StopReport("sglang", 1.0, enabled="disabled" if disable
                                                                 else "enabled")])
    monkeypatch.setattr(pipeline, "stop", stop)
    run = _Run()
    pipeline.stop_task(run)
    assert run.said == ["sglang: still enabled: a reboot starts it again (`inv stop --host t1 --service sglang "
                        "--disable` keeps it stopped)"]
    run = _Run()
    pipeline.stop_task(run, disable=True)
    assert run.said == ["sglang: disabled: a reboot leaves it stopped (`inv deploy --host t1` enables and starts it)"]
    assert asked == [False, True]


def test_inv_stop_passes_disable_to_each_host(tmp_path, monkeypatch):
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    t1:\n      address: 192.0.2.1\n      services:\n"
                                        "        - {name: sglang, model_path: /models/m}\n")
    asked = []
    monkeypatch.setattr(pipeline, "stop_task", lambda run, names=None, disable=False: asked.append((names, disable)))
    monkeypatch.setattr(cli, "run_hosts", lambda hosts, body, roles, opts, out: [
        HostReport(h.name, result=body(None)) for h in hosts])
    tasks.stop(Context(), host="t1", inventory=str(tmp_path), disable=True)
    tasks.stop(Context(), host="t1", inventory=str(tmp_path), service="sglang")
    assert asked == [(None, True), (["sglang"], False)]
