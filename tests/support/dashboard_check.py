"""For a fleet test: which of the dashboard's queries (specops/fleetwide/dashboard.py) a real
Prometheus answers with no series."""
import json
import urllib.error
import urllib.parse
import urllib.request

from specops.fleetwide.dashboard import expand


def panels_return_series(prom_url: str, queries, timeout: float = 10) -> list[str]:
    """The queries (as the dashboard holds them, `$host` and `$service` in) that the Prometheus at
    `prom_url` answers with no series, each run as Grafana sends it with every host and service
    selected (`expand`), by Prometheus's instant query API (GET /api/v1/query).  A query Prometheus
    refuses raises AssertionError with its answer."""
    empty = []
    for query in queries:
        url = f"{prom_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expand(query)})}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                body = json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"Prometheus refused {expand(query)!r}: {e.code} {e.read().decode()}") from e
        assert body.get("status") == "success", (query, body)
        if not body["data"]["result"]:
            empty.append(query)
    return empty
