"""Day 2 on the sandbox fleet, end to end with the real parts: Debian's node exporter on two
sandbox hosts (installed by the monitoring role from the hosts' apt repository), specops's
textfile, SGLang's own /metrics (the simulator's, with 0.5.23's names), and Debian's Prometheus on
the controller's loopback scraping both hosts with the configuration `inv monitoring` wrote.

One load runs through the whole test; the alerts are read from Prometheus's own API.  The rules'
fixed `for:` durations (minutes, for a real fleet; promtool's unit tests in test_monitoring.py hold
them) are cut to seconds here, and the watch's `for:` comes from the inventory as a user sets it."""
import json
import socket
import subprocess
import threading
import time
import urllib.request

import pytest
import yaml

from conftest import load_json
from sandbox import aptrepo
from sandbox.provision import sandbox_service

pytestmark = pytest.mark.fleet
HOSTS = ("t1", "t2")
KNOBS = {"SGLANG_SIM_TOK_S": "200", "SGLANG_SIM_ACCEPT_RATE": "0.8", "SGLANG_SIM_STARTUP_DELAY": "1"}
WATCH_FOR = 10  # seconds: the service's watch.for
SCRAPE = 2      # seconds: --scrape-interval (and Prometheus's rule evaluation)
TEXTFILE = "/var/lib/prometheus/node-exporter/specops.prom"
KNOB_FILE = "/run/sglang-sim/accept_rate"  # the simulator's acceptance while it runs (sim_perf.py)
KEY = "sk-day2-7f3c9e1b5a"  # the servers' API key: /metrics needs none (SGLang's auth.py), and it is never exported


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Load:
    """Requests to each host's SGLang (bound to its address), one client per host, until stopped
    or `limit` seconds have passed."""

    def __init__(self, addresses, limit=600):
        self.addresses, self.limit, self.stop, self.served = addresses, limit, threading.Event(), {}
        self.threads = [threading.Thread(target=self.client, args=(a,), daemon=True) for a in addresses]

    def client(self, address):
        end = time.monotonic() + self.limit
        body = json.dumps({"text": "The capital of France is", "sampling_params": {"max_new_tokens": 48}}).encode()
        while not self.stop.is_set() and time.monotonic() < end:
            try:
                req = urllib.request.Request(f"http://{address}:30000/generate", body,
                                             {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
                urllib.request.urlopen(req, timeout=10).read()
                self.served[address] = self.served.get(address, 0) + 1
            except OSError:
                time.sleep(0.2)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(15)


class Prometheus:
    """Debian's prometheus on 127.0.0.1, with its own storage, for one test."""

    def __init__(self, config_dir, data):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config_dir}/prometheus.yml", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def api(self, path):
        return json.loads(get(f"http://127.0.0.1:{self.port}/api/v1/{path}"))["data"]

    def alerts(self, name, state="firing"):
        """{host: alert} of the alerts named `name` in `state`."""
        try:
            return {a["labels"].get("host"): a for a in self.api("alerts")["alerts"]
                    if a["labels"]["alertname"] == name and a["state"] == state}
        except OSError:
            return {}

    def wait(self, what, timeout, every=0.5):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, "prometheus exited"
            try:
                got = what()
            except OSError:  # not listening yet
                got = None
            if got:
                return got
            time.sleep(every)
        return None

    def up(self):
        """The targets that are up, when all of them are."""
        targets = self.api("targets")["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


WATCHED = ("SpecDecodeNotPayingOff", "SpecDecodeDegraded")  # their `for:` is the watch's


def short_fors(config_dir, seconds):
    """The fixed alerts' `for:` cut to `seconds` (the watch's stays as the inventory wrote it)."""
    path = config_dir / "rules" / "specops.rules.yml"
    doc = yaml.safe_load(path.read_text())
    for rule in doc["groups"][0]["rules"]:
        if "alert" in rule and rule["alert"] not in WATCHED and "for" in rule:
            rule["for"] = f"{seconds}s"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture
def watched(sandbox, tmp_path):
    """t1 and t2 deployed with monitoring and a measured release; a Prometheus that scrapes them."""
    hosts = {n: sandbox.reset(n) for n in HOSTS}
    deb = aptrepo.controller_deb("prometheus-node-exporter")
    for h in hosts.values():
        aptrepo.serve(h, [], remove=False, debs=(deb,))
    svc = sandbox_service(env=KNOBS, bind="0.0.0.0", api_key=KEY,
                          watch={"accept_fraction": 0.7, "for": f"{WATCH_FOR}s", "min_verify_rate": 0.5})
    inv = sandbox.inventory({n: {"services": [svc], "monitoring": {"refresh": "5s"}} for n in HOSTS})
    yield hosts, inv


def deploy(sandbox, inv, *args):
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    res = sandbox.inv("deploy", "--group", "fleet", "--json", str(report), *args, inventory=inv, timeout=600)
    return res, (load_json(report)["hosts"] if report.exists() else {})


def test_prometheus_sees_a_draft_stop_paying_on_one_host_drift_and_restarts(sandbox, watched, tmp_path):
    hosts, inv = watched
    res, rep = deploy(sandbox, inv)
    assert res.returncode == 0, res.stdout[-4000:]
    said = [line for line in res.stdout.splitlines() if f"series in {TEXTFILE}" in line]
    assert sorted(line.split()[0] for line in said) == list(HOSTS), res.stdout[-3000:]
    for name, h in hosts.items():
        text = h.path(TEXTFILE).read_text()
        assert 'specops_release_info{service="sglang"' in text and 'specops_drift{service="sglang",kind="files"} 0' in text
        assert 'sglang_version="' in text and "specops_unit_active" in text and KEY not in text, text
        exported = get(f"http://{h.address}:9100/metrics")  # node exporter's textfile collector
        assert 'specops_release_info{' in exported and 'specops_unit_restarts_total{service="sglang"} 0' in exported
        assert KEY not in exported and KEY not in get(f"http://{h.address}:30000/metrics")
    # The role and the textfile, run again: nothing changes.
    res, rep = deploy(sandbox, inv)
    assert res.returncode == 0 and all(rep[n]["changed"] == 0 for n in HOSTS), res.stdout[-4000:]
    # What the release measured: spec-bench keeps it with the release; the timer's next tick says it.
    res = sandbox.inv("spec-bench", "--group", "fleet", "--concurrency", "1", "--requests", "8",
                      "--max-new-tokens", "48", inventory=inv, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:]
    for h in hosts.values():
        assert h.run("sh", "-c", f"sleep 7; grep -c ^specops_release_accept_length{{ {TEXTFILE}").stdout.strip() == "1"
    out = tmp_path / "prom"
    res = sandbox.inv("monitoring", "--out", str(out), "--scrape-interval", f"{SCRAPE}s", inventory=inv)
    assert res.returncode == 0, res.stdout + res.stderr
    short_fors(out, 6)
    assert subprocess.run(["promtool", "check", "config", str(out / "prometheus.yml")]).returncode == 0
    prom = Prometheus(out, tmp_path / "data")
    try:
        with Load([h.address for h in hosts.values()]):
            ups = prom.wait(prom.up, 60)
            assert ups and len(ups) == 4, prom.api("targets")  # SGLang and node exporter on each host
            time.sleep(4 * SCRAPE)
            assert all(prom.alerts(name, "pending") == {} == prom.alerts(name) for name in WATCHED)
            # Traffic that moved on t1: its draft's acceptance falls while the load runs.  spec-bench ran without
            # --baseline (no speedup measured): degraded, the one verdict without an estimate of the speedup.
            hosts["t1"].run("sh", "-c", f"echo 0.1 > {KNOB_FILE}")  # /run is the host's own tmpfs
            t0 = time.monotonic()
            fired = prom.wait(lambda: prom.alerts("SpecDecodeDegraded"), WATCH_FOR + 60)
            took = time.monotonic() - t0
            print(f"\nSpecDecodeDegraded fired for {sorted(fired or {})} {took:.1f} s after t1's acceptance fell "
                  f"(for: {WATCH_FOR} s, scrape {SCRAPE} s)")
            assert fired and set(fired) == {"t1"} and prom.alerts("SpecDecodeNotPayingOff") == {}, fired
            # its for: and two scrape intervals (one to see the fall, one to evaluate), and the simulated
            # server's own window (40 decode steps, under a second) and this loop's polling: 3 s more
            # (with the 5m rate in the rule it took 20.6 s here)
            assert took <= WATCH_FOR + 2 * SCRAPE + 3, took
            assert "inv spec-tune --host t1" in fired["t1"]["annotations"]["run"]
            st = sandbox.inv("status", "--group", "fleet", inventory=inv)
            print(st.stdout)
            assert "t1: sglang: DRAFT DEGRADED: accept length " in st.stdout, st.stdout
            assert "the draft fits this traffic less well, and may still pay; run inv spec-tune --host t1" in st.stdout
            assert "t2: sglang: DRAFT" not in st.stdout
            # Restored: it resolves.
            hosts["t1"].run("rm", KNOB_FILE)
            assert prom.wait(lambda: not prom.alerts("SpecDecodeDegraded"), 60, 1), prom.alerts("SpecDecodeDegraded")
            # A unit edited by hand on t2: drift, until a deploy puts it back.
            unit = hosts["t2"].path("/etc/systemd/system/sglang.service")
            unit.write_text(unit.read_text() + "# tuned by hand\n")
            drift = prom.wait(lambda: prom.alerts("SpecopsDrift"), 60)
            kinds = {a["labels"]["kind"] for a in prom.api("alerts")["alerts"]
                     if a["labels"]["alertname"] == "SpecopsDrift" and a["state"] == "firing"}
            # the file differs from the release's, and the server started before it changed
            assert drift and set(drift) == {"t2"} and "files" in kinds, (drift, kinds)
            res, _ = deploy(sandbox, inv)
            assert res.returncode == 0, res.stdout[-3000:]
            assert prom.wait(lambda: not prom.alerts("SpecopsDrift"), 60, 1), prom.alerts("SpecopsDrift")
            # A server killed in a loop: systemd brings it back each time, and Prometheus sees it.
            for _ in range(3):
                hosts["t2"].run("systemctl", "kill", "-s", "KILL", "sglang")
                hosts["t2"].run("sh", "-c", "for i in $(seq 60); do systemctl is-active --quiet sglang && "
                                "curl -sf http://127.0.0.1:30000/health && break; sleep 0.5; done")
            restarting = prom.wait(lambda: prom.alerts("SGLangRestarting"), 60)
            assert restarting and set(restarting) == {"t2"}, restarting
    finally:
        prom.close()
