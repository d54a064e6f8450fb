"""SGLang's admin endpoints on the sandbox network (issue 46): a server bound beyond loopback
without an api_key is refused before anything changes; with an admin key, another host's calls to
/configure_logging and /update_weights_from_disk without it are refused (the api key is not taken
there either), its key opens them, and /metrics is still served with no key."""
import json

import pytest

from sandbox import peerlink
from sandbox.provision import sandbox_service

pytestmark = pytest.mark.fleet
KEY, ADMIN = "client-key-46", "admin-key-46"


def call(h, url, key=None, body="{}"):
    """(HTTP status, body) of a POST from host h."""
    auth = ["-H", f"Authorization: Bearer {key}"] if key else []
    res = h.run("curl", "-s", "-o", "/tmp/answer", "-w", "%{http_code}", "-X", "POST", "-H",
                "Content-Type: application/json", *auth, "-d", body, url, check=False)
    return int(res.stdout or 0), h.run("cat", "/tmp/answer", check=False).stdout


@pytest.mark.security("admin-open", "a server bound to the host's network with no api_key (refused at plan time); "
                                    "with keys, another host calls /configure_logging and /update_weights_from_disk "
                                    "without the admin key")
def test_admin_endpoints_are_closed_to_another_host_and_metrics_stay_open(sandbox):
    t1, t2 = sandbox.reset("t1"), sandbox.reset("t2")
    addr = peerlink.up(t2, t1)[1]
    try:
        before = t1.run("ls", "/etc/systemd/system").stdout
        open_inv = sandbox.inventory({"t1": {"services": [sandbox_service(bind="0.0.0.0")]}})
        res = sandbox.inv("deploy", "--host", "t1", inventory=open_inv)
        assert res.returncode != 0
        assert "t1: service 'sglang': listening on 0.0.0.0, it needs an api_key" in res.stderr + res.stdout
        assert t1.run("ls", "/etc/systemd/system").stdout == before  # refused before any change

        inv = sandbox.inventory({"t1": {"services": [sandbox_service(bind="0.0.0.0", api_key=KEY,
                                                                     admin_api_key=ADMIN)]}})
        res = sandbox.inv("deploy", "--host", "t1", inventory=inv)
        assert res.returncode == 0, res.stdout[-3000:]
        assert ADMIN not in res.stdout + res.stderr
        assert ADMIN not in t1.run("systemctl", "show", "-p", "ExecStart", "sglang").stdout
        base = f"http://{addr}:30000"
        dump = json.dumps({"dump_requests_folder": "/tmp/anyone", "dump_requests_threshold": 1})
        for path, body in (("/configure_logging", dump), ("/update_weights_from_disk", '{"model_path": "/tmp/x"}')):
            for key in (None, KEY, "wrong"):
                assert call(t2, base + path, key, body)[0] == 401, (path, key)
        assert call(t2, base + "/configure_logging", ADMIN, dump)[0] == 200  # the admin key opens it
        assert call(t2, base + "/configure_logging", ADMIN, json.dumps({"dump_requests_folder": ""}))[0] == 200
        metrics = t2.run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", base + "/metrics").stdout
        assert metrics == "200"
        assert call(t2, base + "/generate", None, '{"text": "hi"}')[0] == 401  # clients need the api key
    finally:
        peerlink.down(t2, t1)
