"""status's reading of production (specops/flows/status.py): what the unit runs, the draft that
no longer pays, and what --strict fails on; pure, no fleet."""
from types import SimpleNamespace

from specops import protocol
from specops.flows import status

UNIT = ('[Service]\nExecStart="/opt/specops/venvs/aaa/bin/python" "/usr/local/lib/specops/launch.py" "-m" '
        '"sglang.launch_server"\n')


def kept(current="2", releases=None):
    return protocol.ReleasesResult(current=current, releases=releases or [
        {"stamp": "1", "status": "deployed", "services": ["sglang"], "venv": "/opt/specops/venvs/aaa",
         "packages": {"sglang": "0.5.23"}, "spec": {"sglang": {}},
         "perf": {"sglang": {"accept_length": {"1": 3.1}, "speedup": {"1": 1.8}}}},
        {"stamp": "2", "status": "deployed", "services": ["sglang"], "venv": "/opt/specops/venvs/bbb",
         "packages": {"sglang": "0.5.24"}, "spec": {"sglang": {}}}])


def test_status_names_the_stack_and_release_the_unit_runs_not_the_inventory_s():
    ran = status.runs(UNIT, kept(current="1"), "sglang", None, "/opt/specops/venvs/bbb")
    assert ran == {"venv": "/opt/specops/venvs/aaa", "release": "1", "sglang": "0.5.23",
                   "inventory_venv": "/opt/specops/venvs/bbb"}
    line = status._runs_lines("t1", {"service": "sglang", "runs": ran})[0]
    assert line == ("t1: sglang runs sglang 0.5.23 from stack /opt/specops/venvs/aaa (release 1); the inventory asks "
                    "for stack /opt/specops/venvs/bbb: inv deploy to run it")
    # the release current names another stack (a rollback left the unit on an older one): the older release
    assert status.runs(UNIT, kept(current="2"), "sglang", None, "/opt/specops/venvs/aaa")["release"] == "1"


def test_a_draft_below_its_watch_fraction_with_traffic_is_said_not_to_pay():
    host, svc = SimpleNamespace(name="t1"), {"name": "sglang", "watch": {"accept_fraction": 0.7}}
    ran = {"release": "1"}
    low = status.production(host, svc, {"accept_length": 1.8, "verify_calls": 5000}, kept(), ran)
    assert low["not_paying"] == ("accept length 1.8 in production, 3.1 when deployed at 1 (spec-bench): the draft no "
                                 "longer fits this traffic; run inv spec-tune --host t1")
    assert "not_paying" not in status.production(host, svc, {"accept_length": 2.3, "verify_calls": 5000}, kept(), ran)
    assert "not_paying" in status.production(host, svc, {"accept_length": 1.8, "verify_calls": status.MIN_VERIFY_CALLS},
                                             kept(), ran)
    # too little traffic to judge, and a release that measured nothing: no verdict
    assert "not_paying" not in status.production(host, svc, {"accept_length": 1.2, "verify_calls": 50}, kept(), ran)
    assert "not_paying" not in status.production(host, svc, {"accept_length": 1.2, "verify_calls": 5000}, kept(),
                                                 {"release": "2"})


def test_strict_fails_on_what_needs_doing_and_only_on_that():
    calm = {"service": "sglang", "drift": [], "stale": [], "restarts": 0, "spec_mismatch": [],
            "runs": {"venv": "/v", "inventory_venv": "/v"}, "production": {"accept_length": 3.0}}
    assert not status.needs_doing({"t1": {"services": [calm]}})
    for change in ({"drift": ["x"]}, {"restarts": 2}, {"production": {"not_paying": "…"}},
                   {"runs": {"venv": "/old", "inventory_venv": "/v"}}, {"not_serving": "503"}):
        assert status.needs_doing({"t1": {"services": [{**calm, **change}]}}), change


def test_production_is_said_with_its_figures_and_too_little_traffic_is_not_judged():
    p = {"accept_length": 0.0, "gen_throughput": 0.0, "running": 0, "queue": 0, "verify_calls": 11}
    line = status._runs_lines("t1", {"service": "sglang", "production": p})[0]
    assert line == ("t1: sglang in production: too little traffic yet to judge its accept length; 0.0 tok/s; "
                    "0 running, 0 queued; 11 verify calls since start")
    p.update(accept_length=2.5, verify_calls=500, deployed_accept_length=3.0, deployed_source="spec-bench")
    assert "accept length 2.50, 3.00 measured by spec-bench;" in status._runs_lines("t1", {"service": "sglang",
                                                                                          "production": p})[0]
