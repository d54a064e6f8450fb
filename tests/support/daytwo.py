"""For the day-2 fleet tests: Debian's Prometheus and Alertmanager on the controller's loopback
(each for one test, with storage of its own), a webhook receiver that keeps what Alertmanager
posts, and closed-loop load on the sandbox hosts' servers."""
import json
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Load:
    """Requests to each address's SGLang (port 30000, with `key`), `clients` each, until stopped
    or `limit` seconds have passed; each request's text the next of `texts`."""

    def __init__(self, addresses, key, limit=900, texts=("The capital of France is",), clients=1, max_new_tokens=48):
        self.addresses, self.key, self.limit, self.stop, self.served = addresses, key, limit, threading.Event(), {}
        self.texts, self.max_new_tokens, self.sent = list(texts), max_new_tokens, 0
        self.threads = [threading.Thread(target=self.client, args=(a,), daemon=True)
                        for a in addresses for _ in range(clients)]

    def request(self, text):
        """(path, body) of one request of `text`: /generate's here."""
        return "/generate", {"text": text, "sampling_params": {"max_new_tokens": self.max_new_tokens}}

    def client(self, address):
        end = time.monotonic() + self.limit
        while not self.stop.is_set() and time.monotonic() < end:
            self.sent += 1
            path, body = self.request(self.texts[self.sent % len(self.texts)])
            try:
                req = urllib.request.Request(f"http://{address}:30000{path}", json.dumps(body).encode(),
                                             {"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.key}"})
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


class Daemon:
    """A program of the controller's, started for one test, ended with it (its own session)."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Prometheus(Daemon):
    """Debian's prometheus on 127.0.0.1, with its own storage."""

    def __init__(self, config_dir, data):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(["prometheus", f"--config.file={config_dir}/prometheus.yml", f"--storage.tsdb.path={data}",
                          f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"])

    def api(self, path):
        return json.loads(get(f"{self.url}/api/v1/{path}"))["data"]

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


class Webhook:
    """An HTTP receiver on 127.0.0.1 that keeps every JSON body posted to it (Alertmanager's)."""

    def __init__(self):
        self.received = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Alertmanager(Daemon):
    """Debian's alertmanager (0.25) on 127.0.0.1, no cluster, every alert to `webhook`, grouped by
    alert and host (docs/monitoring.md's routing, with seconds for minutes)."""

    def __init__(self, webhook_url, workdir):
        self.port = free_port()
        config = workdir / "alertmanager.yml"
        config.write_text(yaml.safe_dump({
            "route": {"receiver": "hook", "group_by": ["alertname", "group", "host"], "group_wait": "1s",
                      "group_interval": "2s", "repeat_interval": "1h"},
            "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url}]}]}))
        assert subprocess.run(["amtool", "check-config", str(config)], capture_output=True).returncode == 0
        super().__init__(["prometheus-alertmanager", f"--config.file={config}", f"--storage.path={workdir / 'am'}",
                          f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="])
