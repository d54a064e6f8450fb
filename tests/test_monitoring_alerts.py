"""Every alert of `inv monitoring`'s rule file unit-tested by the real `promtool test rules`
against series shaped as the scrape gives them (the router fleet of support/monitoring.py,
fleet()): each fires where it should, with its labels and annotations, and stays quiet where it
should not."""
import re

import pytest
import yaml

from support.monitoring import GROUPS, promtool, scraped


def node(name, host, **labels):
    return scraped(name, host, job="node", service="sglang", **labels)


def traffic(host, tokens_per_min, verifies_per_min, minutes=30):
    """SGLang's two counters on `host` growing at these rates for `minutes`, and its accept-length
    gauge (its last window) at their ratio."""
    window = tokens_per_min / verifies_per_min if verifies_per_min else 0
    return [{"series": scraped("sglang:generation_tokens_total", host, is_streaming="false"),
             "values": f"0+{tokens_per_min}x{minutes}"},
            {"series": scraped("sglang:spec_verify_calls_total", host), "values": f"0+{verifies_per_min}x{minutes}"},
            {"series": scraped("sglang:spec_accept_length", host, tp_rank="0"), "values": f"{window}x{minutes}"}]


def passes(host, mode, per_min, service="sglang"):
    return {"series": scraped("sglang:cuda_graph_passes_total", host, service=service, tp_rank="0", mode=mode),
            "values": f"0+{per_min}x30"}


def expected(rule_file, alert, host, value=None, service="sglang", **labels):
    """The alert promtool must see: its labels, and its annotations expanded as Prometheus does."""
    named = [r for r in yaml.safe_load(rule_file.read_text())["groups"][0]["rules"] if r.get("alert") == alert]
    rule = next(r for r in named if len(named) == 1 or f'"{host}' in r["expr"] or f"|{host}" in r["expr"])
    group = GROUPS.get(host, "workers")
    lab = {"host": host, **({"service": service} if service else {}), "group": group, **labels}

    def expand(text):
        text = re.sub(r'\{\{ \$value \| printf "%\.(\d)f" \}\}', lambda m: f"{value:.{m.group(1)}f}", text)
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: lab[m.group(1)], text)
    return {"exp_labels": {**lab, **rule["labels"]},
            "exp_annotations": {k: expand(v) for k, v in rule["annotations"].items()}}


def measured(hosts, speedup=True):
    """What each host's release measured, in its textfile: accept length 3.0 and, when spec-bench
    ran with --baseline, a speedup of 1.8x."""
    return [{"series": node(name, h, source="spec-bench"), "values": f"{v}x30"} for h in hosts
            for name, v in (("specops_release_accept_length", 3), ("specops_release_speedup", 1.8))
            if speedup or name == "specops_release_accept_length"]


def accepting(host, accept):
    """Production on `host` accepting `accept` tokens per verify call, at 30 calls/s."""
    return traffic(host, round(accept * 1800, 6), 1800)


def payoff_cases(r):
    """SpecDecodeDegraded and SpecDecodeNotPayingOff over the same series (a release that measured
    1.8x at accept length 3.0): what each must say, and where neither may."""
    deg, not_paying = "SpecDecodeDegraded", "SpecDecodeNotPayingOff"
    scenarios = [
        # w1 at 0.69 x 3.0: an estimated 1.8 x 2.07 / 3 = 1.24x, still paying, but under 0.7 x 3.0: degraded;
        # w2 at 0.5 x 3.0: 0.90x, not paying (and not degraded as well)
        (measured(("w1", "w2")) + accepting("w1", 2.07) + accepting("w2", 1.5), "20m",
         {deg: [expected(r, deg, "w1", 2.07)], not_paying: [expected(r, not_paying, "w2", 0.9)]},
         [("specops:accept_length:rate5m", {"w1": 2.07, "w2": 1.5})]),
        # w1 at 0.9 x 3.0: neither; w2's release measured no speedup (no --baseline): at 0.5 x 3.0 degraded only
        (measured(("w1",)) + measured(("w2",), speedup=False) + accepting("w1", 2.7) + accepting("w2", 1.5), "20m",
         {deg: [expected(r, deg, "w2", 1.5)], not_paying: []}, []),
        # an estimated 1.1x on both: w3's watch.speedup_margin 0.2 makes it not paying; w1's (0) degraded
        (measured(("w1", "w3")) + accepting("w1", 11 / 6) + accepting("w3", 11 / 6), "20m",
         {deg: [expected(r, deg, "w1", 11 / 6)], not_paying: [expected(r, not_paying, "w3", 1.1)]}, []),
        # w1 at 0.5 x 3.0 with 0.5 verify calls/s: too little traffic to judge; w2's release measured nothing
        # (no spec-bench or spec-tune): nothing to compare with; and not before its `for` (10m)
        (measured(("w1",)) + traffic("w1", 45, 30) + accepting("w2", 1.5), "20m", {deg: [], not_paying: []}, []),
        (measured(("w1",)) + accepting("w1", 1.5), "10m", {deg: [], not_paying: []}, []),
    ]
    return {name: [(series, at, fired[name], recorded) for series, at, fired, recorded in scenarios]
            for name in (deg, not_paying)}


def up(host, job, values):
    return {"series": scraped("up", host, job=job), "values": values}


def cases(r):
    """alert → (its promtool test cases: series, when, what fires)."""
    return {
        **payoff_cases(r),
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
            ([passes("w1", "prefill_none", 60),
              {"series": node("specops_cuda_graph_deployed", "w1"), "values": "1x30"}],
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
        "NodeExporterDown": [
            # fleet() monitors w1 and r: w1's exporter is down (its textfile's series gone with it), r's up;
            # w2's SGLang answers, and the inventory runs no exporter there
            ([up("w1", "node", "0x10"), up("r", "node", "1x10"), up("w1", "sglang", "1x10"),
              up("w2", "sglang", "1x10")],
             "5m", [expected(r, "NodeExporterDown", "w1", service=None)], []),
            # r's is missing altogether (no target, or a configuration older than the inventory): absent
            ([up("w1", "node", "1x10"), up("w2", "sglang", "1x10")], "5m",
             [expected(r, "NodeExporterDown", "r", service=None)], []),
            # down for less than its minute
            ([up("w1", "node", "1 1 1 1 0 0"), up("r", "node", "1x10")], "4m", [], []),
        ],
        "SpecopsTextfileMissing": [
            # w1: SGLang and its exporter answer, no specops series; w2: not monitored (no exporter in the
            # inventory); r: its textfile is there
            ([up("w1", "sglang", "1x20"), up("w1", "node", "1x20"), up("w2", "sglang", "1x20"), up("r", "node", "1x20"),
              {"series": scraped("specops_textfile_timestamp_seconds", "r", job="node"), "values": "0+60x20"}],
             "10m", [expected(r, "SpecopsTextfileMissing", "w1", service=None)], []),
            # its exporter is down: NodeExporterDown says so, this one does not as well
            ([up("w1", "sglang", "1x20"), up("w1", "node", "0x20")], "10m", [], []),
            # the textfile is there; and not before its 5m
            ([up("w1", "sglang", "1x20"), up("w1", "node", "1x20"),
              {"series": scraped("specops_textfile_timestamp_seconds", "w1", job="node"), "values": "0+60x20"}],
             "10m", [], []),
            ([up("w1", "sglang", "1x20"), up("w1", "node", "1x20")], "4m", [], []),
        ],
        "SpecopsTextfileStale": [
            # w1's timer stopped at the start (its file says 0); w2's writes every minute
            ([{"series": scraped("specops_textfile_timestamp_seconds", "w1", job="node"), "values": "0x30"},
              {"series": scraped("specops_textfile_timestamp_seconds", "w2", job="node"), "values": "0+60x30"}],
             "20m", [expected(r, "SpecopsTextfileStale", "w1", 1200.0, service=None)], []),
            ([{"series": scraped("specops_textfile_timestamp_seconds", "w1", job="node"), "values": "0x30"}],
             "14m", [], []),
            # its threshold, 600 s, pinned (issue 49): w1's file always 601 s old fires, w2's always 599 s old not
            ([{"series": scraped("specops_textfile_timestamp_seconds", "w1", job="node"), "values": "-601+60x30"},
              {"series": scraped("specops_textfile_timestamp_seconds", "w2", job="node"), "values": "-599+60x30"}],
             "20m", [expected(r, "SpecopsTextfileStale", "w1", 601.0, service=None)], []),
        ],
    }


ALERTS = ["SpecDecodeNotPayingOff", "SpecDecodeDegraded", "SGLangDown", "SGLangRestarting", "ServingQueueGrowing",
          "CudaGraphOff", "SpecopsDrift", "ReleaseUnverified", "SpecopsTextfileStale", "NodeExporterDown",
          "SpecopsTextfileMissing"]


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


def test_an_exporter_down_silences_the_textfile_s_alerts_and_names_them(written):
    """w1's draft fell to 2.0 of the 3.0 its release measured while its exporter ran:
    SpecDecodeDegraded fires.  Then the exporter goes down (its textfile's series go stale with
    it): only NodeExporterDown fires, and says that the draft's alerts cannot."""
    rule_file = written / "rules" / "specops.rules.yml"
    down = expected(rule_file, "NodeExporterDown", "w1", service=None)
    said = down["exp_annotations"]["description"]
    # every alert that reads only the textfile's series is named; SGLangDown also reads the scrape's up
    assert re.search(r"so CudaGraphOff, ReleaseUnverified, SGLangRestarting, SpecDecodeDegraded, "
                     r"SpecDecodeNotPayingOff, SpecopsDrift, SpecopsTextfileStale cannot fire for this host, and "
                     r"SGLangDown sees only whether SGLang answers", said), said
    release = {"series": node("specops_release_accept_length", "w1", source="spec-bench"), "values": "3x20 stale"}
    series = [release, up("w1", "node", "1x20 0x30"), up("r", "node", "1x50"), up("w1", "sglang", "1x50"),
              *traffic("w1", 3600, 1800, minutes=50)]
    fired = {("18m", "SpecDecodeDegraded"): [expected(rule_file, "SpecDecodeDegraded", "w1", 2.0)],
             ("35m", "NodeExporterDown"): [down]}
    test = {"interval": "1m", "input_series": series, "alert_rule_test": [
        {"eval_time": at, "alertname": name, "exp_alerts": fired.get((at, name), [])} for at in ("18m", "35m")
        for name in ("SpecDecodeDegraded", "SpecDecodeNotPayingOff", "NodeExporterDown")]}
    (written / "test-silence.yml").write_text(yaml.safe_dump({"rule_files": ["rules/specops.rules.yml"],
                                                             "evaluation_interval": "1m", "tests": [test]}))
    promtool("test", "rules", "test-silence.yml", cwd=written)


def test_node_exporter_down_s_run_installs_it_where_it_is_missing(written):
    """NodeExporterDown's `run` is a deploy: the monitoring role of a monitored host installs
    Debian's prometheus-node-exporter when it is missing (and nothing on a host not monitored)."""
    from roles import monitoring as role
    from specops.inventory import Host
    from specops.ops.apt import AptPackages
    rule_file = written / "rules" / "specops.rules.yml"
    assert (expected(rule_file, "NodeExporterDown", "w1", service=None)["exp_annotations"]["run"]
            == "inv deploy --host w1")
    installs = [op.names for op in role.ops(Host("w1", {"monitoring": True})) if isinstance(op, AptPackages)]
    assert installs == [["prometheus-node-exporter"]]
    assert role.ops(Host("w2", {"monitoring": False})) == []
