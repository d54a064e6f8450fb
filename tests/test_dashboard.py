"""`inv monitoring`'s Grafana dashboard without a fleet: the JSON model and its provisioning file
as written for a router fleet's inventory, every panel query parsed by the real promtool and run
by `promtool test rules` on series shaped as the scrape labels them, every series it names one
docs/monitoring.md lists (or a recording rule), and every selector filtered by the variables."""
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml

from specops import inventory
from specops.fleetwide import alerts, dashboard, prometheus
from roles import VOCABULARY
from support import ROOT
from support.dashboard_check import panels_return_series
from support.monitoring import fleet, promtool, scraped

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SERVICES = [("w1", "sglang"), ("w2", "sglang"), ("w3", "sglang"), ("n0", "big")]  # fleet()'s scraped services
HOST_ONLY = {"specops_textfile_timestamp_seconds"}  # the textfile's own series: no service label
PROMETHEUS_OWN = {"up"}  # Prometheus's series of each target


@pytest.fixture
def written(tmp_path):
    out = tmp_path / "prom"
    prometheus.write(fleet(tmp_path), out)
    return out


def series_names(expr: str) -> set[str]:
    """The series an expression reads: its names outside strings, matchers, ranges and label
    lists, that are neither a function nor a keyword."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set(re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", e))
    return names - {"and", "or", "unless", "bool", "offset"}


def documented() -> set[str]:
    """Every series the tables of docs/monitoring.md's "The metrics" list (SGLang's, specops's,
    the recording rules): the code spans of each row's first cell."""
    text = (ROOT / "docs" / "monitoring.md").read_text()
    section = text.split("\n## The metrics\n", 1)[1].split("\n## ", 1)[0]
    cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in cells for name in re.findall(r"`([a-zA-Z_:][\w:]*)`", cell)}


def test_the_dashboard_is_grafana_s_json_model_with_a_panel_per_figure(written):
    model = json.loads((written / "grafana" / "specops.json").read_text())
    assert (model["uid"], model["title"], model["id"]) == ("specops-fleet", "specops fleet", None)
    assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
    ds, host, service = model["templating"]["list"]
    assert (ds["type"], ds["name"], ds["query"]) == ("datasource", "datasource", "prometheus")
    assert (host["name"], service["name"]) == ("host", "service")
    for var in (host, service):
        assert (var["type"], var["datasource"], var["includeAll"], var["multi"], var["allValue"]) == (
            "query", DATASOURCE, True, True, ".*")
        assert re.fullmatch(r"label_values\(up\{.*\}, %s\)" % var["name"], var["query"]), var["query"]
    assert 'host=~"$host"' in service["query"]  # the services of the hosts selected
    panels = model["panels"]
    assert [p["title"] for p in panels] == [
        "Accept length: production against the release", "Tokens/s", "Requests running and queued", "Up",
        "Unit active", "Verified", "Drift", "Restarts", "Textfile age"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        assert p["type"] in ("timeseries", "stat") and p["datasource"] == DATASOURCE, p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE and t["expr"] and t["legendFormat"], (p["title"], t)
    assert [t["expr"] for p in panels for t in p["targets"]] == dashboard.queries(fleet(written.parent))


def as_documented(expr: str) -> str:
    """A query as docs/monitoring.md's panel table writes it: without the variables' matchers,
    and a threshold line's fraction and services as FRACTION."""
    e = re.sub(r'(, )?\b(host|service)=~"\$\2"', "", expr).replace("{}", "").replace("{, ", "{")
    if re.match(r"[\d.]+ \* ", e):
        e = re.sub(r"\{[^}]*\}", "", re.sub(r"^[\d.]+", "FRACTION", e))
    return e


def test_the_docs_list_each_panel_with_its_queries(written):
    text = (ROOT / "docs" / "monitoring.md").read_text()
    section = text.split("\n## The dashboard\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| panel ")]
    panels = json.loads((written / "grafana" / "specops.json").read_text())["panels"]
    assert [(r[0], r[1].replace(" ", "")) for r in rows] == [(p["title"], p["type"]) for p in panels]
    for row, p in zip(rows, panels):
        spans = {span.replace("\\|", "|") for span in re.findall(r"`([^`]+)`", row[2])}
        assert sorted({as_documented(t["expr"]) for t in p["targets"]} - spans) == [], p["title"]
    age = panels[-1]["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]
    stale = next(r for r in alerts.fixed() if r["alert"] == "SpecopsTextfileStale")
    assert age == {"color": "red", "value": 600} and stale["expr"].endswith("> 600")


def test_the_same_inventory_gives_the_same_dashboard_and_provisioning(tmp_path):
    one, _ = prometheus.files(fleet(tmp_path), out=tmp_path / "prom")
    two, _ = prometheus.files(fleet(tmp_path), out=tmp_path / "prom")
    assert one[dashboard.DASHBOARD] == two[dashboard.DASHBOARD] and one[dashboard.PROVISIONING] == two[
        dashboard.PROVISIONING]
    assert one[dashboard.DASHBOARD] == json.dumps(json.loads(one[dashboard.DASHBOARD]), indent=2, sort_keys=True) + "\n"


def test_the_provisioning_file_is_a_dashboards_provider_reading_the_written_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prometheus.write(inventory.load(ROOT / "inventory.example", VOCABULARY), "prom")  # a relative DIR
    doc = yaml.safe_load((tmp_path / "prom" / "grafana" / "provisioning.yml").read_text())
    assert doc["apiVersion"] == 1 and len(doc["providers"]) == 1
    provider = doc["providers"][0]
    assert (provider["type"], provider["name"], provider["folder"], provider["updateIntervalSeconds"]) == (
        "file", "specops", "specops", 30)
    # Grafana reads a relative path from its own working directory: the path is absolute
    assert provider["options"]["path"] == str(tmp_path / "prom" / "grafana")
    assert json.loads((tmp_path / "prom" / "grafana" / "specops.json").read_text())["uid"] == "specops-fleet"


def test_expand_selects_every_host_and_service():
    assert dashboard.expand('x{host=~"$host", service=~"${service}"}') == 'x{host=~".*", service=~".*"}'
    assert dashboard.expand('x{hostname=~"$hostname"}') == 'x{hostname=~"$hostname"}'


def test_every_panel_query_and_variable_parses_with_every_host_selected(written):
    model = json.loads((written / "grafana" / "specops.json").read_text())
    exprs = [dashboard.expand(q) for q in dashboard.queries(fleet(written.parent))]
    exprs += [dashboard.expand(re.fullmatch(r"label_values\((.*), \w+\)", v["query"]).group(1))
              for v in model["templating"]["list"] if v["type"] == "query"]
    assert not [e for e in exprs if "$" in e]
    rule_file = written / "dashboard.rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    assert f"SUCCESS: {len(exprs)} rules found" in promtool("check", "rules", str(rule_file))


def test_every_series_a_panel_reads_is_documented_or_recorded(tmp_path):
    allowed = documented() | {name for name, _ in alerts.RECORDING} | PROMETHEUS_OWN
    assert {"sglang:num_queue_reqs", "specops_drift", "specops_textfile_timestamp_seconds"} <= allowed
    read = {q: series_names(q) for q in dashboard.queries(fleet(tmp_path))}
    assert all(read.values()), read
    assert sorted(n for names in read.values() for n in names if n not in allowed) == []


def test_every_selector_is_filtered_by_the_host_and_service_variables(tmp_path):
    for q in dashboard.queries(fleet(tmp_path)):
        selectors = re.findall(r"([a-zA-Z_:][\w:]*)\{([^}]*)\}", q)
        assert {name for name, _ in selectors} == series_names(q), q  # no series read without a selector
        for name, matchers in selectors:
            assert 'host=~"$host"' in matchers, q
            host_only = name in HOST_ONLY or (name == "up" and 'job="node"' in matchers)
            assert ('service=~"$service"' in matchers) != host_only, q


def test_the_accept_length_panel_draws_each_watch_s_alert_threshold(tmp_path):
    """fleet(): w3 watches at 0.9, the other speculative services at the default 0.7."""
    lines = [q for q in dashboard.queries(fleet(tmp_path)) if q[0].isdigit()]
    each = 'host=~"$host", service=~"$service"'
    assert lines == [
        f'0.7 * max by (host, service) (specops_release_accept_length{{host="n0", service="big", {each}}})',
        f'0.7 * max by (host, service) (specops_release_accept_length{{host=~"w1|w2", service="sglang", {each}}})',
        f'0.9 * max by (host, service) (specops_release_accept_length{{host="w3", service="sglang", {each}}})']


def inputs() -> list[dict]:
    """Ten minutes of every series the panels read, for each scraped service of fleet(), shaped as
    the scrape labels them."""
    out = []
    for host, svc in SERVICES:
        sg = {"service": svc, "tp_rank": "0"}
        node = {"job": "node", "service": svc}
        out += [{"series": scraped(name, host, **labels), "values": values} for name, labels, values in [
            ("sglang:spec_accept_length", sg, "2.5x10"), ("sglang:gen_throughput", sg, "200x10"),
            ("sglang:num_running_reqs", sg, "3x10"), ("sglang:num_queue_reqs", sg, "1x10"),
            ("sglang:generation_tokens_total", {**sg, "is_streaming": "false"}, "0+600x10"),
            ("sglang:spec_verify_calls_total", sg, "0+200x10"), ("up", {"service": svc}, "1x10"),
            ("specops_release_accept_length", {**node, "source": "spec-bench"}, "3x10"),
            ("specops_unit_active", node, "1x10"), ("specops_verified", node, "1x10"),
            ("specops_drift", {**node, "kind": "files"}, "0x10"), ("specops_unit_restarts_total", node, "0x10")]]
        out += [{"series": scraped("up", host, job="node"), "values": "1x10"},
                {"series": scraped("specops_textfile_timestamp_seconds", host, job="node"), "values": "0+60x10"}]
    return out


def absent(series: str, labels: list[str]) -> str:
    """A query that is empty when `series` has a sample with each of `labels` set."""
    matchers = ", ".join(f'{label}!=""' for label in labels)
    return f"absent({series}{{{matchers}}})" if labels else f"absent({series})"


def test_every_panel_query_returns_series_with_the_labels_its_legend_names(written):
    """Each query, recorded as a rule, over the rules of rules/specops.rules.yml (its recording
    rules) and the series a scrape gives: at 10 minutes, a series with every label its legend
    shows ({{host}}, {{service}}, ...)."""
    model = json.loads((written / "grafana" / "specops.json").read_text())
    targets = [t for p in model["panels"] for t in p["targets"]]
    (written / "dashboard.rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": dashboard.expand(t["expr"])} for i, t in enumerate(targets)]}]}))
    tests = [{"expr": absent(f"dashboard:query{i}", re.findall(r"\{\{\s*(\w+)\s*\}\}", t["legendFormat"])),
              "eval_time": "10m", "exp_samples": []} for i, t in enumerate(targets)]
    (written / "test-dashboard.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules/specops.rules.yml", "dashboard.rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs(), "promql_expr_test": tests}]}, sort_keys=False))
    promtool("test", "rules", "test-dashboard.yml", cwd=written)


class FakePrometheus(BaseHTTPRequestHandler):
    """/api/v1/query: one series for a query of `up`, none for any other; records each query."""
    asked: list = []

    def do_GET(self):
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        self.asked.append(query)
        result = [{"metric": {"host": "w1"}, "value": [0, "1"]}] if query.startswith("up{") else []
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_panels_return_series_names_the_queries_prometheus_answers_with_nothing():
    server = HTTPServer(("127.0.0.1", 0), FakePrometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/"
        assert panels_return_series(url, ['up{host=~"$host"}', 'specops_verified{service=~"$service"}']) == [
            'specops_verified{service=~"$service"}']
    finally:
        server.shutdown()
        server.server_close()
    assert FakePrometheus.asked == ['up{host=~".*"}', 'specops_verified{service=~".*"}']
