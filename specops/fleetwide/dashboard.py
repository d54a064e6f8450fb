"""The fleet's Grafana dashboard (grafana/specops.json, Grafana's classic dashboard JSON model)
and the file that provisions it (grafana/provisioning.yml, a dashboards provider), which
`inv monitoring` writes beside the Prometheus configuration.

Its panels read what Prometheus scrapes with the targets' labels (targets.py), per host and
service: SGLang's own series, specops's textfile series, the recording rules of alerts.py and each
job's `up`.  Every selector is filtered by the dashboard's variables `host` and `service` (a
series of the host alone, such as the textfile's age, by `host`), whose "All" is `.*`; the
Prometheus to read is the variable `datasource`.  The panels' queries are data (`queries`), and
`expand` gives each as Prometheus runs it with every host and service selected, so that a test
can run them against a real Prometheus.  The same inventory gives the same dashboard; the
provisioning file names the directory it was written to.
"""
from __future__ import annotations

import re
from collections import defaultdict

from .alerts import TEXTFILE_STALE_S, selectors, watched
from .targets import JOBS

DIR = "grafana"
DASHBOARD = f"{DIR}/specops.json"
PROVISIONING = f"{DIR}/provisioning.yml"
UID = "specops-fleet"
TITLE = "specops fleet"
SCHEMA_VERSION = 39  # Grafana 10.3 to 11.2 write this; a later Grafana migrates it on load
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
EACH = 'host=~"$host", service=~"$service"'  # the variables' matchers, on a series of a service
HOST = 'host=~"$host"'                        # on a series of the host alone
WHO = "{{host}}/{{service}}"
WIDTH = 24  # Grafana's grid is 24 columns wide
SERVED = "|".join(j for j in JOBS if j != "node")  # the jobs whose targets are services


def per_service(series: str, agg: str = "max", labels: str = "host, service") -> str:
    return f"{agg} by ({labels}) ({series}{{{EACH}}})"


def threshold_lines(inventory) -> list[tuple[str, str]]:
    """SpecDecodeDegraded's threshold, accept_fraction × what the release measured: one
    query per fraction the inventory's `watch:` settings give and set of services."""
    by_fraction = defaultdict(list)
    for w, pairs in watched(inventory).items():
        by_fraction[w.accept_fraction] += pairs
    return [(f"{fraction:g} * max by (host, service) (specops_release_accept_length{{{sel}, {EACH}}})",
             f"{WHO} alert under ({fraction:g} x release)")
            for fraction, pairs in sorted(by_fraction.items()) for sel in selectors(pairs)]


def mapping(*pairs) -> list[dict]:
    """A stat's value mapping: (value, text, colour) each."""
    return [{"type": "value", "options": {str(v): {"text": text, "color": colour, "index": i}
                                          for i, (v, text, colour) in enumerate(pairs)}}]


def steps(*pairs) -> dict:
    """Thresholds: the base colour, then (from value, colour) each."""
    base, *rest = pairs
    return {"mode": "absolute", "steps": [{"color": base, "value": None}] +
            [{"color": colour, "value": value} for value, colour in rest]}


UP = mapping((0, "DOWN", "red"), (1, "up", "green"))
RED_UNDER_1 = steps("red", (1, "green"))


def panel(title: str, kind: str, width: int, height: int, targets: list[tuple[str, str]], description: str,
          unit: str = "none", mappings: list | None = None, thresholds: dict | None = None) -> dict:
    """A panel before its place on the grid: targets are (expr, legendFormat) each."""
    return {"title": title, "type": kind, "w": width, "h": height, "targets": targets,
            "description": description, "unit": unit, "mappings": mappings or [], "thresholds": thresholds}


def panels(inventory) -> list[dict]:
    """The dashboard's panels, in reading order."""
    return [
        panel("Accept length: production against the release", "timeseries", 24, 9, [
            (f"specops:accept_length:window{{{EACH}}}", f"{WHO} production"),
            (per_service("specops_release_accept_length"), f"{WHO} release"),
            *threshold_lines(inventory)],
              "Tokens per verify step: SGLang's own figure over its last decode-log window (the recording rule "
              "specops:accept_length:window), what the release's spec-bench or spec-tune measured, and where "
              "SpecDecodeDegraded fires (the service's watch.accept_fraction of the release's)."),
        panel("Tokens/s", "timeseries", 12, 8, [
            (per_service("sglang:gen_throughput", "sum"), WHO),
            (f"specops:generation_tokens:rate5m{{{EACH}}}", f"{WHO} (5m, finished requests)")],
              "Tokens generated per second: SGLang's gauge, summed over the service's ranks, and the 5-minute "
              "rate of its counter (counted when a request ends).", unit="short"),
        panel("Requests running and queued", "timeseries", 12, 8, [
            (per_service("sglang:num_running_reqs", "sum"), f"{WHO} running"),
            (per_service("sglang:num_queue_reqs", "sum"), f"{WHO} queued")],
              "Requests each service runs and keeps waiting, summed over its ranks.", unit="short"),
        panel("Up", "stat", 8, 5, [
            (f'max by (job, host, service) (up{{job=~"{SERVED}", {EACH}}})', f"{{{{job}}}} {WHO}"),
            (f'max by (job, host) (up{{job="node", {HOST}}})', "node_exporter {{host}}")],
              "Whether Prometheus reaches each target (its up).", mappings=UP, thresholds=RED_UNDER_1),
        panel("Unit active", "stat", 8, 5, [(per_service("specops_unit_active"), WHO)],
              "Whether the service's systemd unit is active (specops's textfile).", mappings=UP,
              thresholds=RED_UNDER_1),
        panel("Verified", "stat", 8, 5, [(per_service("specops_verified"), WHO)],
              "Whether the last verify of the service passed.",
              mappings=mapping((0, "FAILED", "red"), (1, "passed", "green")), thresholds=RED_UNDER_1),
        panel("Drift", "stat", 8, 5, [(per_service("specops_drift", labels="host, service, kind"),
                                       f"{WHO} {{{{kind}}}}")],
              "1 when the host differs from its release: files (a managed file changed) or stale (the server "
              "runs older code or weights than its files).",
              mappings=mapping((0, "none", "green"), (1, "DRIFT", "red")), thresholds=steps("green", (1, "red"))),
        panel("Restarts", "stat", 8, 5, [(per_service("specops_unit_restarts_total"), WHO)],
              "systemd's restarts of the unit since it was last started on purpose.",
              thresholds=steps("green", (1, "orange"))),
        panel("Textfile age", "stat", 8, 5, [
            (f"time() - max by (host) (specops_textfile_timestamp_seconds{{{HOST}}})", "{{host}}")],
              "Seconds since specops's textfile was written on the host: when old, the drift, verify and "
              "unit panels are old too (SpecopsTextfileStale).", unit="s",
              thresholds=steps("green", (TEXTFILE_STALE_S, "red"))),
    ]


def queries(inventory) -> list[str]:
    """Every panel's expressions, with the variables as Grafana receives them."""
    return [expr for p in panels(inventory) for expr, _ in p["targets"]]


def expand(expr: str) -> str:
    """The expression as Grafana sends it with every host and service selected (their "All")."""
    return re.sub(r"\$(host|service)\b|\$\{(host|service)\}", ".*", expr)


def ref(i: int) -> str:
    """A target's refId: A, B, ..., Z, AA, AB, ..."""
    return ref(i // 26 - 1) + chr(65 + i % 26) if i >= 26 else chr(65 + i)


def grafana_panel(p: dict, pid: int, x: int, y: int) -> dict:
    defaults = {"unit": p["unit"], "mappings": p["mappings"]}
    if p["thresholds"]:
        defaults.update(thresholds=p["thresholds"], color={"mode": "thresholds"})
    options = ({"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"}} if p["type"] == "timeseries" else
               {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "background",
                "graphMode": "none", "textMode": "value_and_name", "justifyMode": "auto", "orientation": "auto"})
    return {"id": pid, "type": p["type"], "title": p["title"], "description": p["description"],
            "datasource": DATASOURCE, "gridPos": {"x": x, "y": y, "w": p["w"], "h": p["h"]},
            "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
            "targets": [{"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref(i)}
                        for i, (expr, legend) in enumerate(p["targets"])]}


def variable(name: str, query: str) -> dict:
    """A query variable over Prometheus's label values: several or all ("All" is `.*`)."""
    return {"type": "query", "name": name, "label": name, "datasource": DATASOURCE, "query": query,
            "definition": query, "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "regex": "",
            "sort": 1, "hide": 0}


def dashboard(inventory) -> dict:
    """The dashboard's JSON model: the panels flowed left to right, a row at a time."""
    placed, x, y, row_height = [], 0, 0, 0
    for pid, p in enumerate(panels(inventory), 1):
        if x + p["w"] > WIDTH:
            x, y, row_height = 0, y + row_height, 0
        placed.append(grafana_panel(p, pid, x, y))
        x, row_height = x + p["w"], max(row_height, p["h"])
    datasource = {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus",
                  "current": {}, "options": [], "refresh": 1, "regex": "", "hide": 0}
    return {"title": TITLE, "uid": UID, "id": None, "schemaVersion": SCHEMA_VERSION, "version": 1,
            "tags": ["specops"], "editable": True, "graphTooltip": 1, "refresh": "30s", "timezone": "",
            "time": {"from": "now-6h", "to": "now"}, "annotations": {"list": []}, "links": [],
            "templating": {"list": [datasource, variable("host", f'label_values(up{{job=~"{"|".join(JOBS)}"}}, host)'),
                                    variable("service", f'label_values(up{{job=~"{SERVED}", {HOST}}}, service)')]},
            "panels": placed}


def provisioning(directory: str) -> dict:
    """A dashboards provider (apiVersion 1) that reads the dashboard from `directory`, absolute:
    Grafana reads a relative path from its own working directory."""
    return {"apiVersion": 1, "providers": [{
        "name": "specops", "orgId": 1, "folder": "specops", "type": "file", "disableDeletion": False,
        "allowUiUpdates": False, "updateIntervalSeconds": 30,
        "options": {"path": directory, "foldersFromFilesStructure": False}}]}
