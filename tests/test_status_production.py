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
                    "for stack /opt/specops/venvs/bbb: to run it, inv deploy --host t1")
    # the release current names another stack (a rollback left the unit on an older one): the older release
    assert status.runs(UNIT, kept(current="2"), "sglang", None, "/opt/specops/venvs/aaa")["release"] == "1"


def test_with_a_measured_speedup_a_draft_is_said_not_to_pay_below_1_and_degraded_below_its_fraction():
    """Release 1 measured 1.8x at accept length 3.1 (spec-bench): production's 1.5 estimates 0.87x,
    not paying; 1.8 estimates 1.05x, still paying, but under 0.7 x 3.1: degraded; 2.3 neither."""
    host, svc = SimpleNamespace(name="t1"), {"name": "sglang", "watch": {"accept_fraction": 0.7}}
    ran = {"release": "1"}

    def judged(accept, svc=svc, calls=5000, release=kept(), up=600):
        out = status.production(host, svc, {"accept_length": accept, "verify_calls": calls}, release, ran, up)
        return {k: out[k] for k in status.VERDICTS if k in out}
    assert judged(1.5) == {"not_paying": "estimated speedup 0.87× (accept length 1.5 in production; 1.80× at accept "
                                         "length 3.1 when deployed at 1 (spec-bench)), under 1: below 1 speculative "
                                         "decoding costs more than it gives; run inv spec-tune --host t1 --traffic"}
    assert judged(1.8) == {"degraded": "accept length 1.8 in production, under 0.7 × accept length 3.1 when deployed "
                                       "at 1 (spec-bench): the draft fits this traffic less well, and may still pay; "
                                       "run inv spec-tune --host t1 --traffic"}
    assert judged(2.3) == {}
    figures = status.production(host, svc, {"accept_length": 2.3, "verify_calls": 5000}, kept(), ran, 600)
    assert (figures["deployed_accept_length"], figures["deployed_speedup"], figures["deployed_source"]) == (
        3.1, 1.8, "spec-bench")
    # a margin: 1.05x is under 1 + 0.1
    assert list(judged(1.8, {**svc, "watch": {"speedup_margin": 0.1}})) == ["not_paying"]
    # traffic enough to judge: watch.min_verify_rate verify calls a second (default 1) over its uptime
    assert list(judged(1.8, calls=600)) == ["degraded"] and judged(1.8, calls=599) == {}
    assert list(judged(1.8, {**svc, "watch": {"min_verify_rate": 0.5}}, calls=300)) == ["degraded"]
    assert judged(1.8, up=None) == {} and judged(1.8, calls=0, svc={**svc, "watch": {"min_verify_rate": 0}}) == {}
    # a release that measured no speedup (spec-bench without --baseline): the fraction alone
    alone = kept(releases=[{**kept().releases[0], "perf": {"sglang": {"accept_length": {"1": 3.1}}}}], current="1")
    assert list(judged(1.5, release=alone)) == ["degraded"]
    # too little traffic to judge, and a release that measured nothing: no verdict
    assert judged(1.2, calls=50) == {}
    assert status.production(host, svc, {"accept_length": 1.2, "verify_calls": 5000}, kept(), {"release": "2"},
                             600).keys().isdisjoint(status.VERDICTS)


def test_strict_fails_on_what_needs_doing_and_only_on_that():
    calm = {"service": "sglang", "drift": [], "stale": [], "restarts": 0, "spec_mismatch": [],
            "runs": {"venv": "/v", "inventory_venv": "/v"}, "production": {"accept_length": 3.0}}
    assert not status.needs_doing({"t1": {"services": [calm]}})
    for change in ({"drift": ["x"]}, {"restarts": 2}, {"production": {"not_paying": "…"}},
                   {"production": {"degraded": "…"}},
                   {"runs": {"venv": "/old", "inventory_venv": "/v"}}, {"not_serving": "503"}):
        assert status.needs_doing({"t1": {"services": [{**calm, **change}]}}), change


def test_production_is_said_with_its_figures_and_too_little_traffic_is_not_judged():
    p = {"accept_length": 0.0, "gen_throughput": 0.0, "running": 0, "queue": 0, "verify_calls": 11}
    line = status._runs_lines("t1", {"service": "sglang", "production": p})[0]
    assert line == ("t1: sglang in production: too little traffic yet to judge its accept length; 0.0 tok/s; "
                    "0 running, 0 queued; 11 verify calls since start")
    p.update(accept_length=2.5, verify_calls=500, deployed_accept_length=3.0, deployed_source="spec-bench", judged=True)
    assert "accept length 2.50, 3.00 measured by spec-bench;" in status._runs_lines("t1", {"service": "sglang",
                                                                                          "production": p})[0]
    p.update(not_paying="estimated speedup 0.87× …")
    assert status._runs_lines("t1", {"service": "sglang", "production": p})[1:] == [
        "t1: sglang: DRAFT NOT PAYING: estimated speedup 0.87× …"]
    p.pop("not_paying")
    p.update(degraded="accept length 1.8 in production, …")
    assert status._runs_lines("t1", {"service": "sglang", "production": p})[1:] == [
        "t1: sglang: DRAFT DEGRADED: accept length 1.8 in production, …"]
