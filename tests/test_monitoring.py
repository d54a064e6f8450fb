"""`inv monitoring` without a fleet: the Prometheus configuration written from the example
inventory and from a router fleet's, checked by the real promtool (`check config`, `check rules`),
and every alert unit-tested by `promtool test rules` against series shaped as the scrape gives
them: each fires where it should and stays quiet where it should not."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specops import inventory
from specops.errors import UsageError
from specops.fleetwide import monitoring, rules, targets
from specops.inventory import reach

ROOT = Path(__file__).resolve().parent.parent
SPEC = {"algorithm": "EAGLE3", "draft_model_path": "/m/draft", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
SG = {"name": "sglang", "model_path": "/m/llama", "served_model_name": "llama", "bind": "0.0.0.0", "port": 30001,
      "speculative": SPEC}
WATCHED = {"accept_fraction": 0.9, "for": "5m", "min_verify_rate": 0.1}


def promtool(*args, cwd=None):
    if not shutil.which("promtool"):
        pytest.fail("promtool is missing: run scripts/setup.sh (Debian's prometheus package)")
    run = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def fleet(tmp_path):
    """Workers w1..w3 (w3 on IPv6, with its own watch), routers r (default metrics port) and r2
    (its own), a service across n0 and n1, and a service of w1 with its metrics off."""
    big = {"name": "big", "model_path": "/m/big", "tp": 2, "nodes": ["n0", "n1"], "bind": "0.0.0.0",
           "speculative": SPEC}
    router = {"name": "router", "kind": "router", "workers": {"group": "workers"}, "api_key": "rk-1"}
    doc = {"all": {"children": {
        "workers": {"hosts": {
            "w1": {"address": "10.0.0.1", "services": [SG, {"name": "plain", "model_path": "/m/p", "port": 30002,
                                                           "metrics": False}]},
            "w2": {"address": "10.0.0.2", "router_address": "10.9.0.2", "services": [SG]},
            "w3": {"address": "fd00::3", "services": [{**SG, "watch": WATCHED}]}}},
        "edge": {"hosts": {"r": {"address": "10.0.0.9", "services": [router]},
                           "r2": {"address": "10.0.0.10", "services": [{**router, "extra_args": [
                               "--prometheus-port", "29100"]}]}}},
        "big": {"vars": {"services": [big]}, "hosts": {"n0": {"address": "10.0.1.0"}, "n1": {"address": "10.0.1.1"}}},
    }}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    inv = inventory.load(tmp_path)
    # the monitoring role's var: true, or its settings; false or absent: no node_exporter
    inv.hosts["w1"].vars["monitoring"] = True
    inv.hosts["r"].vars["monitoring"] = {"textfile_dir": "/var/lib/prometheus/node-exporter", "refresh": "1min"}
    inv.hosts["w2"].vars["monitoring"] = False
    return inv


@pytest.fixture
def written(tmp_path):
    out = tmp_path / "prom"
    monitoring.write(fleet(tmp_path), out, "30s", ["am.example:9093"])
    return out


def _targets(out, job):
    return [(e["targets"][0], e["labels"]) for e in json.loads((out / "targets" / f"{job}.json").read_text())]


def test_the_example_inventory_gives_a_configuration_promtool_accepts(tmp_path):
    written, warnings = monitoring.write(inventory.load(ROOT / "inventory.example"), tmp_path, "15s")
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == [
        "prometheus.yml", "rules/specops.rules.yml", "targets/node.json", "targets/sglang-router.json",
        "targets/sglang.json"]
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
    monitoring.write(inventory.load(ROOT / "inventory.example"), example, "15s")
    for out in (written, example):
        for job in monitoring.JOBS:
            clash = [(t, sorted(set(lab) & targets.SGLANG_LABELS)) for t, lab in _targets(out, job)
                     if set(lab) & targets.SGLANG_LABELS]
            assert not clash, (job, clash)
    assert {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"} <= targets.SGLANG_LABELS


def test_one_not_paying_off_rule_per_watch_setting_selecting_exactly_its_services(tmp_path):
    found = [(r["for"], r["expr"].splitlines()[0]) for r in rules.rules(fleet(tmp_path))["groups"][0]["rules"]
             if r.get("alert") == "SpecDecodeNotPayingOff"]
    assert found == [("10m", 'specops:accept_length:window{host="n0", service="big"}'),
                     ("5m", 'specops:accept_length:window{host="w3", service="sglang"}'),
                     ("10m", 'specops:accept_length:window{host=~"w1|w2", service="sglang"}')]
    assert rules.selectors([("a.b", "s"), ("c", "s"), ("c", "t")]) == [
        'host="c", service="t"', 'host=~"a\\\\.b|c", service="s"']


def test_the_same_inventory_gives_the_same_bytes_and_bad_input_is_refused(tmp_path):
    inv = fleet(tmp_path)
    assert monitoring.files(inv)[0] == monitoring.files(inv)[0]
    with pytest.raises(UsageError, match="--scrape-interval: a duration is Prometheus's"):
        monitoring.files(inv, "15 seconds")
    with pytest.raises(UsageError, match="--alertmanager: give HOST:PORT"):
        monitoring.files(inv, "15s", ["am"])
    inv.hosts["w3"]["services"][0]["watch"] = {"accept_fraction": 1.5}
    with pytest.raises(UsageError, match=r"w3: service 'sglang': watch.accept_fraction: give a fraction"):
        monitoring.files(inv)
    doc = {"all": {"hosts": {"a": {"services": [{**SG, "watch": {"for": "ten minutes"}}]}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match=r"services\[0\].watch.for: a duration is Prometheus's"):
        inventory.load(tmp_path)


def test_one_address_rule_for_routers_ranks_and_scrapes(tmp_path):
    inv = fleet(tmp_path)
    w2, w3 = inv.hosts["w2"], inv.hosts["w3"]
    assert reach.service_url(w2, SG, from_host="r", via="router_address") == "http://10.9.0.2:30001"
    assert reach.service_url(w2, SG, from_host="w2", via="router_address") == "http://127.0.0.1:30001"
    assert reach.service_hostport(w3, SG) == "[fd00::3]:30001"
    assert inv.hosts["n1"]["services"][0]["dist_init_addr"] == "10.0.1.0:50000"


def test_the_task_says_what_it_wrote_and_refuses_a_bad_interval(tmp_path):
    inv = [sys.executable, "-m", "invoke", "monitoring", "--inventory", str(ROOT / "inventory.example")]
    ok = subprocess.run([*inv, "--out", str(tmp_path / "p")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and f"wrote {tmp_path / 'p' / 'prometheus.yml'}" in ok.stdout, ok.stderr
    assert "warning: ct129/sglang listens on 127.0.0.1 only" in ok.stderr
    bad = subprocess.run([*inv, "--out", str(tmp_path / "q"), "--scrape-interval", "soon"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "error: --scrape-interval" in bad.stderr and not (tmp_path / "q").exists()


# --- the alerts, unit-tested by promtool ---------------------------------------------------------

# the labels SGLang 0.5.23 puts on each of its own series
OWN = {"model_name": "llama", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}


def scraped(name, host, job="sglang", **labels):
    """A series as the scrape labels it: the target's labels (targets.py) and the metric's own."""
    target = {"sglang": {"instance": f"{host}:30001", "role": "sglang", "service": "sglang", "served": "llama"},
              "node": {"instance": f"{host}:9100", "role": "node"}}[job]
    group = "big" if host == "n0" else "workers"
    own = OWN if name.startswith("sglang:") else {}
    all_labels = {**target, **own, "job": job, "host": host, "group": group, **labels}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(all_labels.items())) + "}"


def node(name, host, **labels):
    return scraped(name, host, job="node", service="sglang", **labels)


def traffic(host, tokens_per_min, verifies_per_min):
    """SGLang's two counters on `host` growing at these rates for 30 minutes, and its accept-length
    gauge (its last window) at their ratio."""
    window = tokens_per_min / verifies_per_min if verifies_per_min else 0
    return [{"series": scraped("sglang:generation_tokens_total", host, is_streaming="false"),
             "values": f"0+{tokens_per_min}x30"},
            {"series": scraped("sglang:spec_verify_calls_total", host), "values": f"0+{verifies_per_min}x30"},
            {"series": scraped("sglang:spec_accept_length", host, tp_rank="0"), "values": f"{window}x30"}]


def passes(host, mode, per_min, service="sglang"):
    return {"series": scraped("sglang:cuda_graph_passes_total", host, service=service, tp_rank="0", mode=mode),
            "values": f"0+{per_min}x30"}


def expected(rule_file, alert, host, value=None, service="sglang", **labels):
    """The alert promtool must see: its labels, and its annotations expanded as Prometheus does."""
    rule = next(r for r in yaml.safe_load(rule_file.read_text())["groups"][0]["rules"] if r.get("alert") == alert
                and (alert != "SpecDecodeNotPayingOff" or f'"{host}' in r["expr"] or f"|{host}" in r["expr"]))
    group = "big" if host == "n0" else "workers"
    lab = {"host": host, **({"service": service} if service else {}), "group": group, **labels}

    def expand(text):
        text = re.sub(r'\{\{ \$value \| printf "%\.(\d)f" \}\}', lambda m: f"{value:.{m.group(1)}f}", text)
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: lab[m.group(1)], text)
    return {"exp_labels": {**lab, **rule["labels"]},
            "exp_annotations": {k: expand(v) for k, v in rule["annotations"].items()}}


def cases(r):
    """alert → (its promtool test cases: series, when, what fires)."""
    accept = [node("specops_release_accept_length", h, source="spec-bench") for h in ("w1", "w2", "w3")]
    release = [{"series": s, "values": "3x30"} for s in accept]
    return {
        "SpecDecodeNotPayingOff": [
            # w1 fell to 2.0 (< 0.7 x 3), w2 holds 3.0, w3 (its watch: 0.9) fell to 2.6 (< 2.7)
            (release + traffic("w1", 3600, 1800) + traffic("w2", 5400, 1800) + traffic("w3", 4680, 1800), "20m",
             [expected(r, "SpecDecodeNotPayingOff", "w1", 2.0), expected(r, "SpecDecodeNotPayingOff", "w3", 2.6)],
             [("specops:accept_length:rate5m", {"w1": 2.0, "w2": 3.0, "w3": 2.6})]),
            # w1 at 2.6 is within its default 0.7; w2 fell, with 0.5 verify calls/s: too little traffic
            (release + traffic("w1", 4680, 1800) + traffic("w2", 60, 30), "20m", [], []),
            # and not before its `for` (10m) has passed
            (release + traffic("w1", 3600, 1800), "10m", [], []),
        ],
        "SGLangDown": [
            ([{"series": scraped("up", "w1"), "values": "1x10"}, {"series": scraped("up", "w2"), "values": "0x10"},
              {"series": node("specops_unit_active", "w1"), "values": "1x10"}], "5m",
             [expected(r, "SGLangDown", "w2")], []),
            ([{"series": scraped("up", "w1"), "values": "1x10"},
              {"series": node("specops_unit_active", "w1"), "values": "0x10"}], "5m",
             [expected(r, "SGLangDown", "w1")], []),
            ([{"series": scraped("up", "w1"), "values": "1x10"},
              {"series": node("specops_unit_active", "w1"), "values": "1 1 1 1 0 0 0 0 0 0"}], "4m", [], []),
        ],
        "SGLangRestarting": [
            ([{"series": node("specops_unit_restarts_total", "w1"), "values": "0x5 1x3 2x10"},
              {"series": node("specops_unit_restarts_total", "w2"), "values": "0x5 1x10"},
              {"series": node("specops_unit_restarts_total", "w3"), "values": "5x5 0x10"}], "12m",
             [expected(r, "SGLangRestarting", "w1", 2.0)], []),
            ([{"series": node("specops_unit_restarts_total", "w1"), "values": "0 1 2 2x30"}], "30m", [], []),
        ],
        "ServingQueueGrowing": [
            ([{"series": scraped("sglang:num_queue_reqs", "w1", tp_rank="0"), "values": "0+2x20"},
              {"series": scraped("sglang:num_queue_reqs", "w2", tp_rank="0"), "values": "50x20"},
              {"series": scraped("sglang:num_queue_reqs", "w3", tp_rank="0"), "values": "0+0.2x20"}], "15m",
             [expected(r, "ServingQueueGrowing", "w1", 30.0)], []),
        ],
        "CudaGraphOff": [
            # w1: decodes, none with a graph; w2: the same, deployed without graphs; w3: graphs for the small
            # batches only (a big batch runs without); n0: graphs always
            ([passes("w1", "decode_none", 300), passes("w2", "decode_none", 300), passes("w3", "decode_none", 300),
              passes("w3", "decode_cuda_graph", 300), passes("n0", "decode_cuda_graph", 300, service="big"),
              passes("w1", "prefill_none", 60)]
             + [{"series": node("specops_cuda_graph_deployed", h), "values": v}
                for h, v in (("w1", "1x30"), ("w2", "0x30"), ("w3", "1x30"))]
             + [{"series": scraped("specops_cuda_graph_deployed", "n0", job="node", service="big"), "values": "1x30"}],
             "15m", [expected(r, "CudaGraphOff", "w1")], []),
            # no decode at all (no traffic): nothing to judge
            ([passes("w1", "prefill_none", 60), {"series": node("specops_cuda_graph_deployed", "w1"), "values": "1x30"}],
             "15m", [], []),
        ],
        "SpecopsDrift": [
            # a run that holds the host lock: its changes are not drift yet
            ([{"series": node("specops_drift", "w1", kind="files"), "values": "1x10"},
              {"series": scraped("specops_run_in_progress", "w1", job="node"), "values": "1x10"}], "5m", [], []),
            ([{"series": node("specops_drift", "w1", kind="files"), "values": "1x10"},
              {"series": node("specops_drift", "w1", kind="stale"), "values": "0x10"},
              {"series": node("specops_drift", "w2", kind="stale"), "values": "0 0 0 0 1 1"}], "5m",
             [expected(r, "SpecopsDrift", "w1", kind="files")], []),
        ],
        "ReleaseUnverified": [
            ([{"series": node("specops_verified", "w1"), "values": "0x10"},
              {"series": node("specops_verified", "w2"), "values": "1x10"}], "5m",
             [expected(r, "ReleaseUnverified", "w1")], []),
        ],
        "SpecopsTextfileStale": [
            # w1's timer stopped at the start (its file says 0); w2's writes every minute
            ([{"series": scraped("specops_textfile_timestamp_seconds", "w1", job="node"), "values": "0x30"},
              {"series": scraped("specops_textfile_timestamp_seconds", "w2", job="node"), "values": "0+60x30"}],
             "20m", [expected(r, "SpecopsTextfileStale", "w1", 1200.0, service=None)], []),
            ([{"series": scraped("specops_textfile_timestamp_seconds", "w1", job="node"), "values": "0x30"}],
             "14m", [], []),
        ],
    }


ALERTS = ["SpecDecodeNotPayingOff", "SGLangDown", "SGLangRestarting", "ServingQueueGrowing", "CudaGraphOff",
          "SpecopsDrift", "ReleaseUnverified", "SpecopsTextfileStale"]


def test_every_alert_of_the_rules_has_a_promtool_test(written):
    names = {r["alert"] for r in yaml.safe_load((written / "rules/specops.rules.yml").read_text())["groups"][0]["rules"]
             if "alert" in r}
    assert names == set(ALERTS) == set(cases(written / "rules/specops.rules.yml"))


@pytest.mark.parametrize("alert", ALERTS)
def test_the_alert_fires_where_it_should_and_nowhere_else(written, alert):
    rule_file = written / "rules" / "specops.rules.yml"
    tests = []
    for series, at, alerts, recorded in cases(rule_file)[alert]:
        exprs = [{"expr": f'round({name}{{host="{h}"}}, 0.01)', "eval_time": at,
                  "exp_samples": [{"labels": '{group="workers",host="%s",service="sglang"}' % h, "value": v}]}
                 for name, values in recorded for h, v in values.items()]
        tests.append({"interval": "1m", "input_series": series, "promql_expr_test": exprs,
                      "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": alerts}]})
    test_file = written / f"test-{alert}.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": ["rules/specops.rules.yml"], "evaluation_interval": "1m",
                                         "tests": tests}, sort_keys=False))
    promtool("test", "rules", test_file.name, cwd=written)
