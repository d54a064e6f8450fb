"""`inv monitoring` without a fleet: the Prometheus configuration written from the example
inventory and from a router fleet's (support/monitoring.py: fleet()), checked by the real promtool (`check config`,
`check rules`): its targets and their labels, the rules per `watch:` setting, refusals.  The
alerts' own promtool tests are test_monitoring_alerts.py's."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from specops import inventory
from specops.errors import UsageError
from specops.fleetwide import alerts, payoff, prometheus, targets
from specops.inventory import reach
from roles import VOCABULARY
from support.monitoring import SG, fleet, promtool

ROOT = Path(__file__).resolve().parent.parent


def _targets(out, job):
    return [(e["targets"][0], e["labels"]) for e in json.loads((out / "targets" / f"{job}.json").read_text())]


def test_the_example_inventory_gives_a_configuration_promtool_accepts(tmp_path):
    written, warnings = prometheus.write(inventory.load(ROOT / "inventory.example", VOCABULARY), tmp_path, "15s")
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == [
        "grafana/provisioning.yml", "grafana/specops.json", "prometheus.yml", "rules/specops.rules.yml",
        "targets/node.json", "targets/sglang-router.json", "targets/sglang.json"]
    assert "SUCCESS" in promtool("check", "config", str(tmp_path / "prometheus.yml"))
    promtool("check", "rules", str(tmp_path / "rules" / "specops.rules.yml"))
    assert _targets(tmp_path, "sglang") == [("10.1.230.172:30000", {
        "host": "ct129", "group": "gpu_boxes", "service": "sglang", "role": "sglang", "served": "kimi-k2.5"})]
    assert _targets(tmp_path, "node") == [] and _targets(tmp_path, "sglang-router") == []
    assert warnings == ["ct129/sglang listens on 127.0.0.1 only: a Prometheus on another machine cannot scrape it "
                        "(give it `bind: 0.0.0.0`, or its address)"]


def test_a_router_fleet_s_targets_are_where_its_services_answer(written):
    promtool("check", "config", str(written / "prometheus.yml"))
    promtool("check", "rules", str(written / "rules" / "specops.rules.yml"))
    config = yaml.safe_load((written / "prometheus.yml").read_text())
    assert config["global"] == {"scrape_interval": "30s", "evaluation_interval": "30s"}
    assert config["rule_files"] == ["rules/specops.rules.yml"]
    assert config["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["am.example:9093"]}]}]}
    assert [(j["job_name"], j["metrics_path"], j["file_sd_configs"][0]["files"]) for j in config["scrape_configs"]] == [
        ("sglang", "/metrics", ["targets/sglang.json"]), ("sglang-router", "/metrics", ["targets/sglang-router.json"]),
        ("node", "/metrics", ["targets/node.json"])]
    sg = [(t, lab["host"], lab["group"], lab["service"], lab["served"]) for t, lab in _targets(written, "sglang")]
    # rank 0 only of the service across nodes; w2 at its address (router_address is the routers'); no `plain`
    assert sg == [("10.0.1.0:30000", "n0", "big", "big", "/m/big"),
                  ("10.0.0.1:30001", "w1", "workers", "sglang", "llama"),
                  ("10.0.0.2:30001", "w2", "workers", "sglang", "llama"),
                  ("[fd00::3]:30001", "w3", "workers", "sglang", "llama")]
    assert {lab["role"] for _, lab in _targets(written, "sglang")} == {"sglang"}
    assert _targets(written, "sglang-router") == [
        ("10.0.0.9:29000", {"host": "r", "group": "edge", "service": "router", "role": "router"}),
        ("10.0.0.10:29100", {"host": "r2", "group": "edge", "service": "router", "role": "router"})]
    assert _targets(written, "node") == [("10.0.0.9:9100", {"host": "r", "group": "edge", "role": "node"}),
                                         ("10.0.0.1:9100", {"host": "w1", "group": "workers", "role": "node"})]


def test_no_target_label_takes_a_label_of_sglang_s_own_series(written, tmp_path):
    """A target label named as a label of the scraped series turns the series' own into
    exported_<name> (DESIGN §16): SGLang's series keep model_name, engine_type and the ranks."""
    example = tmp_path / "example"
    prometheus.write(inventory.load(ROOT / "inventory.example", VOCABULARY), example, "15s")
    for out in (written, example):
        for job in prometheus.JOBS:
            clash = [(t, sorted(set(lab) & targets.SGLANG_LABELS)) for t, lab in _targets(out, job)
                     if set(lab) & targets.SGLANG_LABELS]
            assert not clash, (job, clash)
    assert {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"} <= targets.SGLANG_LABELS


def test_one_payoff_rule_each_per_watch_setting_selecting_exactly_its_services(tmp_path):
    for name in ("SpecDecodeNotPayingOff", "SpecDecodeDegraded"):
        found = [(r["for"], r["expr"].splitlines()[0]) for r in alerts.rules(fleet(tmp_path))["groups"][0]["rules"]
                 if r.get("alert") == name]
        assert found == [("10m", 'specops:accept_length:window{host="n0", service="big"}'),
                         ("5m", 'specops:accept_length:window{host="w3", service="sglang"}'),
                         ("10m", 'specops:accept_length:window{host=~"w1|w2", service="sglang"}')], name
    assert alerts.selectors([("a.b", "s"), ("c", "s"), ("c", "t")]) == [
        'host="c", service="t"', 'host=~"a\\\\.b|c", service="s"']


def test_the_payoff_verdicts_are_one_arithmetic_on_numbers_and_as_promql():
    """payoff.payoff() judges numbers for status and writes the alerts' PromQL: the same
    operations, joined on host and service, bracketed where PromQL would bind otherwise."""
    w = payoff.watch_of(SimpleNamespace(name="h"), {"name": "s"})
    assert w == (0.7, "10m", 1.0, 0.0)
    assert [payoff.payoff(w, a, 3.0, 1.8) for a in (1.5, 2.07, 2.7)] == [(True, True), (False, True), (False, False)]
    assert payoff.payoff(w, 1.5, 3.0) == (None, True)
    a, b, c = (payoff.Series(x) for x in "abc")
    on = "on(host, service) group_left()"
    assert (a * b / c < 1.2).text == f"a\n* {on}\nb\n/ {on}\nc < 1.2"
    assert (a < 0.7 * b).text == f"a\n< {on}\n0.7 * b"
    assert (a * (b / c)).text == f"a\n* {on}\n(b\n/ {on}\nc)"
    assert ((a < b) * 2).text == f"(a\n< {on}\nb) * 2"


def test_the_same_inventory_gives_the_same_bytes_and_bad_input_is_refused(tmp_path):
    inv = fleet(tmp_path)
    assert prometheus.files(inv)[0] == prometheus.files(inv)[0]
    with pytest.raises(UsageError, match="--scrape-interval: a duration is Prometheus's"):
        prometheus.files(inv, "15 seconds")
    with pytest.raises(UsageError, match="--alertmanager: give HOST:PORT"):
        prometheus.files(inv, "15s", ["am"])
    inv.hosts["w3"]["services"][0]["watch"] = {"accept_fraction": 1.5}
    with pytest.raises(UsageError, match=r"w3: service 'sglang': watch.accept_fraction: give a fraction"):
        prometheus.files(inv)
    inv.hosts["w3"]["services"][0]["watch"] = {"speedup_margin": -0.1}
    with pytest.raises(UsageError, match=r"w3: service 'sglang': watch.speedup_margin: give how far above 1"):
        prometheus.files(inv)
    for watch, said in (({"for": "ten minutes"}, "for: a duration is Prometheus's"),
                        ({"speedup_margin": "much"}, "speedup_margin: must be a number")):
        doc = {"all": {"hosts": {"a": {"services": [{**SG, "watch": watch}]}}}}
        (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
        with pytest.raises(UsageError, match=r"services\[0\].watch." + said):
            inventory.load(tmp_path, VOCABULARY)


def test_one_address_rule_for_routers_ranks_and_scrapes(tmp_path):
    inv = fleet(tmp_path)
    w2, w3 = inv.hosts["w2"], inv.hosts["w3"]
    assert reach.service_url(w2, SG, from_host="r", via="router_address") == "http://10.9.0.2:30001"
    assert reach.service_url(w2, SG, from_host="w2", via="router_address") == "http://127.0.0.1:30001"
    assert reach.service_hostport(w3, SG) == "[fd00::3]:30001"
    assert inv.hosts["n1"]["services"][0]["dist_init_addr"] == "10.0.1.0:50000"


def test_the_task_says_what_it_wrote_and_refuses_a_bad_interval_or_a_directory_others_can_write(tmp_path):
    inv = [sys.executable, "-m", "invoke", "monitoring", "--inventory", str(ROOT / "inventory.example")]
    ok = subprocess.run([*inv, "--out", str(tmp_path / "p")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and f"wrote {tmp_path / 'p' / 'prometheus.yml'}" in ok.stdout, ok.stderr
    assert "warning: ct129/sglang listens on 127.0.0.1 only" in ok.stderr
    bad = subprocess.run([*inv, "--out", str(tmp_path / "q"), "--scrape-interval", "soon"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "error: --scrape-interval" in bad.stderr and not (tmp_path / "q").exists()
    (tmp_path / "shared").mkdir(mode=0o777)
    os.chmod(tmp_path / "shared", 0o777)
    shared = subprocess.run([*inv, "--out", str(tmp_path / "shared")], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    error = [line for line in shared.stderr.splitlines() if line.startswith("error: ")]
    assert shared.returncode == 2 and error == [f"error: --out {tmp_path / 'shared'}: {tmp_path / 'shared'} is "
                                                f"writable by others than its owner (mode 0777): nothing written "
                                                f"(only into a directory no one but you and root can change)"]
    assert os.listdir(tmp_path / "shared") == []


@pytest.mark.parametrize("bind, local", [("::1", "[::1]"), ("127.0.0.2", "127.0.0.2"), ("localhost", "127.0.0.1"),
                                         ("0.0.0.0", "127.0.0.1"), ("::", "[::1]"), (None, "127.0.0.1")])
def test_on_its_own_host_a_service_is_reached_where_it_listens_by_verify_and_a_router_alike(tmp_path, bind, local):
    """A server bound to ::1 listens on ::1 only (and one on 127.0.0.2 there only): a router on its
    host and verify both go there, never to 127.0.0.1, which would find nothing (or someone else)."""
    from specops.kinds import kind_of
    svc = {**SG, **({"bind": bind} if bind else {})}
    w2 = fleet(tmp_path).hosts["w2"]
    assert reach.service_url(w2, svc, from_host="w2", via="router_address") == f"http://{local}:30001"
    check = kind_of(svc).check(w2, svc)
    assert f"http://{reach.hostport(check.host, check.port)}" == f"http://{local}:30001"
