"""`inv monitoring --out DIR`: a Prometheus configuration for the inventory, written to DIR.

    DIR/prometheus.yml            global intervals, the rule file, the jobs sglang, sglang-router
                                  and node, each reading its targets from file_sd (relative paths)
    DIR/targets/<job>.json        who to scrape (targets.py)
    DIR/rules/specops.rules.yml   recording rules and alerts (alerts.py)
    DIR/grafana/specops.json      the fleet's Grafana dashboard, and grafana/provisioning.yml, a
                                  dashboards provider that reads it from DIR/grafana (dashboard.py)

Every file is written whole under a temporary name and renamed over the old (a running
Prometheus re-reads targets/ on its own: it never reads half a file), only into directories no one
but the user and root can change, and the same inventory always gives the same bytes (sorted keys
and lists; the provisioning file also names DIR).  Nothing connects to any host.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .. import owndir
from ..errors import SpecopsError, UsageError
from ..inventory.schema import DURATION
from . import dashboard
from .alerts import rules
from .targets import JOBS, targets

CONFIG = "prometheus.yml"
RULES = "rules/specops.rules.yml"
REFRESH = "1m"  # how often Prometheus re-reads a targets file (it also watches it)


def target_file(job: str) -> str:
    return f"targets/{job}.json"


def config(scrape_interval: str, alertmanagers: list[str]) -> dict:
    """prometheus.yml: paths relative to it, as Prometheus reads them."""
    out = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [RULES],
        "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                            "file_sd_configs": [{"files": [target_file(job)], "refresh_interval": REFRESH}]}
                           for job in JOBS],
    }
    if alertmanagers:
        out["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": sorted(alertmanagers)}]}]}
    return out


class _Dumper(yaml.SafeDumper):
    """Block style, and a string of several lines (a PromQL expression) as a literal block."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s
                                                                  else None))


def dump(data) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=True, default_flow_style=False, allow_unicode=True, width=120)


def files(inventory, scrape_interval: str = "15s", alertmanagers: list[str] | None = None,
          out: str | Path = ".") -> tuple[dict, list[str]]:
    """(relative path → text, warnings): everything `write` puts in `out`."""
    if not re.match(DURATION.regex, scrape_interval):
        raise UsageError(f"--scrape-interval: {DURATION.rule}, not {scrape_interval!r}")
    for a in alertmanagers or []:
        if not re.fullmatch(r"\[?[\w.:-]+\]?:\d+", a):
            raise UsageError(f"--alertmanager: give HOST:PORT, not {a!r}")
    by_job, warnings = targets(inventory)
    text = {CONFIG: dump(config(scrape_interval, alertmanagers or [])), RULES: dump(rules(inventory))}
    for job, entries in by_job.items():
        text[target_file(job)] = json.dumps(entries, indent=2, sort_keys=True) + "\n"
    text[dashboard.DASHBOARD] = json.dumps(dashboard.dashboard(inventory), indent=2, sort_keys=True) + "\n"
    text[dashboard.PROVISIONING] = dump(dashboard.provisioning(str(Path(out).resolve() / dashboard.DIR)))
    return text, warnings


def write(inventory, out: str | Path, scrape_interval: str = "15s",
          alertmanagers: list[str] | None = None) -> tuple[list[Path], list[str]]:
    """Write the configuration into `out` (made if missing): (the files written, warnings).  Only
    where no one but the user and root can change a directory, from / down to each of out's
    (owndir.py): someone else's could hold a link at a file's name, or have the targets and rules
    rewritten after.  UsageError: such a directory, before any file; SpecopsError: a file not
    written (nothing already at its temporary name is written through)."""
    texts, warnings = files(inventory, scrape_interval, alertmanagers, out)
    paths = {Path(out) / rel: text for rel, text in texts.items()}
    try:
        for d in sorted({p.parent for p in paths}):  # out first
            why = owndir.make(d, 0o755)
            if why:
                raise UsageError(f"--out {out}: {why}: nothing written (only into a directory no one but you and "
                                 f"root can change)")
        for path, text in sorted(paths.items()):
            owndir.write_whole(path, text.encode(), 0o644)
    except OSError as e:
        raise SpecopsError(f"--out {out}: {e}") from None
    return sorted(paths), warnings
