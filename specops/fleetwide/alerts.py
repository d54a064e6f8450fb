"""Prometheus's recording and alerting rules for the fleet (rules/specops.rules.yml).

The recording rules read SGLang's own figures: production accept length as its counters give it
over 5 minutes (generated tokens per verify call, `specops:accept_length:rate5m`), and as its
gauge gives it for its last decode-log window (`specops:accept_length:window`, what the alert
reads: it follows a change within a scrape), and the traffic `specops:verify_calls:rate5m`.
The alerts join those with the series specops's textfile writes on each host (agent/textfile.py;
docs/monitoring.md lists both), on the `host` and `service` labels the scrape targets give
(targets.py).  SpecDecodeNotPayingOff and SpecDecodeDegraded are the alerts the inventory tunes:
payoff.py's two verdicts on a service, by its `watch:`, one rule each per distinct setting,
selecting its services by label matchers.  NodeExporterDown and SpecopsTextfileMissing follow
the hosts the inventory monitors (targets.monitored): without node_exporter, or without the
textfile behind it, the alerts that read only the textfile cannot fire, and those two name them.
Every alert has a severity, a summary, a description and `run`: the command to run next.
"""
from __future__ import annotations

import re
from collections import defaultdict

from .. import again
from .payoff import Series, enough_traffic, payoff, remedy, watch_of
from .targets import group_of, monitored, scraped

QUEUE_DEPTH = 10  # ServingQueueGrowing: requests waiting, summed over the service's ranks
TEXTFILE_STALE_S = 600  # SpecopsTextfileStale: the textfile's age that says its timer stopped
BY = "group, host, service"  # the labels an alert keeps (targets.py gives them; group routes alerts)

RECORDING = [
    ("specops:generation_tokens:rate5m", f"sum by ({BY}) (rate(sglang:generation_tokens_total[5m]))"),
    ("specops:verify_calls:rate5m", f"sum by ({BY}) (rate(sglang:spec_verify_calls_total[5m]))"),
    ("specops:accept_length:rate5m", "specops:generation_tokens:rate5m / specops:verify_calls:rate5m"),
    # SGLang's own figure over its last decode-log window (40 forwards): what the alert reads, as it
    # follows a change within a scrape, where a 5m rate takes minutes to cross a threshold
    ("specops:accept_length:window", f"avg by ({BY}) (sglang:spec_accept_length)"),
]
WHO = "{{ $labels.host }}/{{ $labels.service }}"
HOST = again.Filled("{{ $labels.host }}")  # Alertmanager fills it in


def alert(name: str, expr: str, for_: str | None, severity: str, summary: str, description: str, run: str) -> dict:
    return {"alert": name, "expr": expr, **({"for": for_} if for_ else {}), "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description, "run": run}}


def fixed() -> list[dict]:
    """The alerts every fleet has; a `run` names the inventory as `inv monitoring` was given it."""
    return [
        alert("SGLangDown", f'max by ({BY}) (up{{job=~"sglang|sglang-router"}}) == 0\n'
                            f"or\nmax by ({BY}) (specops_unit_active) == 0", "1m", "critical",
              f"{WHO} is down",
              "Prometheus cannot scrape it, or its systemd unit is not active.",
              again.command("status", host=HOST)),
        alert("SGLangRestarting", f"max by ({BY}) (increase(specops_unit_restarts_total[15m])) >= 2", None, "warning",
              f"systemd restarted {WHO} {{{{ $value | printf \"%.0f\" }}}} times in 15 minutes",
              "Its unit keeps failing and coming back (Restart=on-failure): read the journal of its last start.",
              again.command("status", host=HOST)),
        alert("ServingQueueGrowing", f"sum by ({BY}) (sglang:num_queue_reqs) > {QUEUE_DEPTH}\n"
                                     f"and on(host, service)\nsum by ({BY}) (deriv(sglang:num_queue_reqs[5m])) > 0",
              "5m", "warning",
              f"{{{{ $value | printf \"%.0f\" }}}} requests wait on {WHO}, and the queue grows",
              "More arrives than it serves: add capacity, or check that speculative decoding still pays off.",
              again.command("status", host=HOST)),
        # 0.5.23 never sets sglang:is_cuda_graph (always 0); its decode passes, counted by mode, tell
        alert("CudaGraphOff", f'sum by ({BY}) (rate(sglang:cuda_graph_passes_total{{mode="decode_none"}}[5m])) > 0\n'
                              f'unless on(host, service)\nsum by ({BY}) '
                              f'(rate(sglang:cuda_graph_passes_total{{mode="decode_cuda_graph"}}[5m])) > 0\n'
                              "and on(host, service)\nmax by (host, service) (specops_cuda_graph_deployed) == 1", "5m",
              "warning", f"{WHO} serves without CUDA graphs",
              "It was deployed to run with CUDA graphs, and none of its decode passes of the last 5 minutes used one: "
              "it is much slower.", again.command("deploy", host=HOST)),
        # a run's changes are drift until its release is recorded: not while it holds the host lock
        alert("SpecopsDrift", f"max by ({BY}, kind) (specops_drift) == 1\n"
                              "unless on(host)\nmax by (host) (specops_run_in_progress) == 1", "2m", "warning",
              f"{WHO} drifted from its release ({{{{ $labels.kind }}}})",
              "files: a managed file differs from the release's copy; stale: the server runs older code or weights "
              f"than its files. `{again.command('deploy', '--check', host=HOST)}` shows what differs.",
              again.command("deploy", host=HOST)),
        alert("ReleaseUnverified", f"max by ({BY}) (specops_verified) == 0", "1m", "critical",
              f"the last verify of {WHO} failed",
              "What runs did not pass verify (ready, its model, its spec arguments, a generation).",
              again.command("verify", host=HOST)),
        # the textfile's own age: without its timer the specops_* series above stay as they last were
        alert("SpecopsTextfileStale", "time() - max by (group, host) (specops_textfile_timestamp_seconds) > "
                                      f"{TEXTFILE_STALE_S}", "5m",
              "warning", "specops's textfile on {{ $labels.host }} was written {{ $value | printf \"%.0f\" }} s ago",
              "Its refresh (the timer specops-textfile.timer) stopped: the drift, verify and unit series of this host "
              "are old. `systemctl status specops-textfile.timer specops-textfile` on the host says why.",
              again.command("deploy", host=HOST)),
    ]


REGEX_META = set(".^$*+?()[]{}|\\")


def _match(label: str, values: list[str]) -> str:
    if len(values) == 1:
        return f'{label}="{_quoted(values[0])}"'
    either = "|".join("".join("\\" + c if c in REGEX_META else c for c in v) for v in values)
    return f'{label}=~"{_quoted(either)}"'


def _quoted(text: str) -> str:
    """A PromQL string's content."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def selectors(pairs) -> list[str]:
    """Label matchers that select exactly these (host, service) pairs: services with the same
    hosts share one."""
    hosts_of = defaultdict(set)
    for host, service in pairs:
        hosts_of[service].add(host)
    services_of = defaultdict(list)
    for service, hosts in hosts_of.items():
        services_of[tuple(sorted(hosts))].append(service)
    return sorted(f'{_match("host", list(h))}, {_match("service", sorted(s))}' for h, s in services_of.items())


def watched(inventory) -> dict:
    """`watch:` setting (payoff.Watch) → the (host, service) pairs it applies to: every scraped
    service with speculative decoding on (the payoff alerts', and the dashboard's line)."""
    settings = defaultdict(list)
    for host in inventory.hosts.values():
        for svc in scraped(host):
            if svc.get("speculative"):
                settings[watch_of(host, svc)].append((host.name, svc["name"]))
    return dict(settings)


def payoff_alerts(inventory) -> list[dict]:
    """SpecDecodeNotPayingOff and SpecDecodeDegraded (payoff.py's two verdicts, written as PromQL),
    for every speculative service with traffic to judge: one rule each per distinct `watch:` and
    set of services.  Where the release measured no speedup (no series) only Degraded can fire."""
    out = []
    for w, pairs in sorted(watched(inventory).items()):
        for sel in selectors(pairs):
            not_paying, degraded = payoff(w, Series(f"specops:accept_length:window{{{sel}}}"),
                                          Series(f"max by (host, service) (specops_release_accept_length{{{sel}}})"),
                                          Series(f"max by (host, service) (specops_release_speedup{{{sel}}})"))
            rate = Series(f"specops:verify_calls:rate5m{{{sel}}}")
            traffic = f"and on(host, service)\n{enough_traffic(w, rate)}"
            held = f"For {w.for_}, with at least {w.min_verify_rate:g} verify calls/s"
            out.append(alert(
                "SpecDecodeNotPayingOff", f"{not_paying.text}\n{traffic}", w.for_, "warning",
                f"speculative decoding on {WHO} gives an estimated {{{{ $value | printf \"%.2f\" }}}}x",
                f"{held}: its release measured a speedup S at accept length A, production now accepts a (SGLang's "
                f"last window), so speculation gives an estimated S x a / A = {{{{ $value | printf \"%.2f\" }}}}x, "
                f"under {1 + w.speedup_margin:g} (1 + watch.speedup_margin). Below 1, speculative decoding costs more "
                f"than it gives. Tune it again (or check the draft, or serve without it).",
                remedy(HOST)))
            out.append(alert(
                "SpecDecodeDegraded", f"{degraded.text}\n{traffic}\nunless on(host, service)\n({not_paying.text})",
                w.for_, "warning",
                f"{WHO} accepts {{{{ $value | printf \"%.2f\" }}}} tokens per verify, under {w.accept_fraction:g} x "
                f"what its release measured",
                f"{held}: production's accept length (SGLang's last window) is under {w.accept_fraction:g} x the "
                f"one its release measured: the draft fits this traffic less well. Speculative decoding may still "
                f"pay: with a measured speedup (spec-bench --baseline, or spec-tune), SpecDecodeNotPayingOff fires "
                f"instead where it no longer does. Tune it again to win it back.",
                remedy(HOST)))
    return out


def silenced(alerts: list[dict]) -> list[str]:
    """The alerts that read only series of the host's textfile (specops_*, through node_exporter),
    with no scrape's `up` to fire on: without node_exporter they cannot fire."""
    return sorted({r["alert"] for r in alerts
                   if re.search(r"\bspecops_\w", r["expr"]) and not re.search(r"\bup\{", r["expr"])})


def exporter_alerts(inventory, others: list[dict]) -> list[dict]:
    """NodeExporterDown (down, or absent on a host the inventory monitors: a target that is
    missing leaves no `up` at all) and SpecopsTextfileMissing; both name what they silence."""
    mute = ", ".join(silenced(others))
    absent = "".join(f'\nor\nmax by (group, host) (absent(up{{job="node", {_match("group", [group_of(h)])}, '
                     f'{_match("host", [h.name])}}}))'
                     for h in sorted(inventory.hosts.values(), key=lambda h: h.name) if monitored(h))
    return [
        alert("NodeExporterDown", f'max by (group, host) (up{{job="node"}}) == 0{absent}', "1m", "warning",
              "node_exporter on {{ $labels.host }} is down",
              "Prometheus cannot scrape it, or has no target for it (its configuration is older than the inventory). "
              f"While it fires, the host's textfile series (release, drift, verify, unit state) are missing, so "
              f"{mute} cannot fire for this host, and SGLangDown sees only whether SGLang answers. "
              "`systemctl status prometheus-node-exporter` on the host says why; a deploy installs it when missing.",
              again.command("deploy", host=HOST)),
        # up{job="node"} has the hosts the inventory monitors only; an exporter that is down is NodeExporterDown's
        alert("SpecopsTextfileMissing", 'max by (group, host) (up{job="sglang"}) == 1\n'
                                        'and on(host)\nmax by (host) (up{job="node"}) == 1\n'
                                        "unless on(host)\nmax by (host) (specops_textfile_timestamp_seconds)",
              "5m", "warning", "node_exporter on {{ $labels.host }} exports no specops textfile",
              "SGLang answers there and node_exporter is up, but no specops_* series come from it: the textfile was "
              "never written, or is written where node_exporter does not read (monitoring.textfile_dir against its "
              f"--collector.textfile.directory). While it fires, {mute} cannot fire for this host.",
              again.command("deploy", host=HOST)),
    ]


def rules(inventory) -> dict:
    """The rule file: one group, the recording rules first (a group evaluates in order)."""
    recorded = [{"record": name, "expr": expr} for name, expr in RECORDING]
    alerts = fixed() + payoff_alerts(inventory)
    alerts = sorted(alerts + exporter_alerts(inventory, alerts), key=lambda r: (r["alert"], r["expr"]))
    return {"groups": [{"name": "specops", "rules": recorded + alerts}]}
