"""Who may reach SGLang's admin endpoints: a server beyond loopback needs an api_key (refused at
plan time otherwise, unless `open_admin: true` says it is open on purpose, with a warning on every
run); an admin key is a secret like the api key; two listeners on one port are refused, naming
both.  The simulator's auth is held to real SGLang 0.5.23's (the slow test)."""
import json
import subprocess

import pytest
import yaml

from roles import VOCABULARY, monitoring, router as router_role, sglang_service
from specops import inventory
from specops.errors import UsageError
from specops.ops import Facts
from specops.kinds import kind_of
from specops.kinds.unitfile import env_text, unit_text

SVC = {"name": "sglang", "model_path": "/m", "port": 30000}


def host(tmp_path, services, **hostvars):
    doc = {"all": {"hosts": {"h1": {"address": "10.0.0.1", "services": services, **hostvars}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(doc))
    return inventory.load(tmp_path, VOCABULARY).hosts["h1"]


def check(tmp_path, **svc):
    h = host(tmp_path, [{**SVC, **svc}])
    sglang_service.check(h, h["services"])
    return h


@pytest.mark.parametrize("bind", ["0.0.0.0", "10.0.0.1", "::"])
def test_a_server_beyond_loopback_without_an_api_key_is_refused_naming_the_service_and_the_keys(tmp_path, bind):
    with pytest.raises(UsageError, match=rf"h1: service 'sglang': listening on {bind}, it needs an api_key: without "
                                         r"one, whoever reaches the port may call SGLang's admin endpoints "
                                         r"\(/configure_logging, .*set open_admin: true"):
        check(tmp_path, bind=bind)


def test_an_admin_key_alone_is_refused_as_server_info_gives_it_away(tmp_path):
    with pytest.raises(UsageError, match=r"an admin_api_key alone is no lock: /server_info, open without an api_key, "
                                         r"returns it"):
        check(tmp_path, bind="0.0.0.0", admin_api_key="admin-key-1")


@pytest.mark.parametrize("svc", [{}, {"bind": "127.0.0.1"}, {"bind": "127.0.0.2"},
                                 {"bind": "0.0.0.0", "api_key": "k-12"},
                                 {"bind": "0.0.0.0", "api_key": "k-12", "admin_api_key": "adm-12"}])
def test_loopback_or_an_api_key_is_accepted_with_no_warning(tmp_path, svc):
    h = check(tmp_path, **svc)
    assert sglang_service.ops_for_service(h, h["services"][0], "/v")[1].warning == ""


def test_open_on_purpose_is_accepted_and_said_on_every_run(tmp_path):
    h = check(tmp_path, bind="0.0.0.0", open_admin=True)
    preflight = sglang_service.ops_for_service(h, h["services"][0], "/v")[1]
    unit = "/etc/systemd/system/sglang.service"
    for sha in ("old", preflight.unit.sha256):  # a change, and nothing to change: said both times
        change = preflight.plan(Facts({"files": {unit: {"sha256": sha}}}), None)
        assert change.warning.startswith("h1: service 'sglang' listens on 0.0.0.0 with no api_key (open_admin: "
                                         "true): anyone who reaches its port may call SGLang's admin endpoints")


def test_the_admin_key_goes_to_the_env_file_and_the_launcher_never_to_the_command_line(tmp_path):
    h = host(tmp_path, [{**SVC, "bind": "0.0.0.0", "api_key": "k-123", "admin_api_key": "adm-456"}])
    svc = h["services"][0]
    kind = kind_of(svc)
    assert 'SGLANG_SPECOPS_ADMIN_API_KEY="adm-456"' in env_text(svc).splitlines()
    argv = kind.argv(svc, "/v")
    assert argv[2:8] == ["--secret", "SGLANG_SPECOPS_API_KEY", "--api-key",
                         "--secret", "SGLANG_SPECOPS_ADMIN_API_KEY", "--admin-api-key"]
    assert "adm-456" not in " ".join(argv) and "adm-456" not in unit_text(svc, "/v")
    assert "adm-456" in kind.secrets(svc)  # every printed line is redacted of it


def test_a_router_takes_no_admin_key(tmp_path):
    h = host(tmp_path, [{"name": "r", "kind": "router", "api_key": "rk-1", "admin_api_key": "adm-1",
                         "workers": {"group": "all"}}, {**SVC, "port": 30001, "api_key": "rk-1",
                                                                  "bind": "0.0.0.0"}])
    with pytest.raises(UsageError, match="admin_api_key and open_admin are an SGLang server's"):
        router_role.check(h, [h["services"][0]])


def test_a_service_on_node_exporters_port_of_a_monitored_host_is_refused_naming_both(tmp_path):
    h = host(tmp_path, [{**SVC, "port": 9100}], monitoring=True)
    for refusing in (lambda: sglang_service.check(h, h["services"]), lambda: monitoring.ops(h)):
        with pytest.raises(UsageError, match=r"h1: port 9100 is taken twice: by sglang 'sglang' \(\S+/hosts.yml: "
                                             r"all.hosts.h1.services\[0\]\) and by node_exporter \(\S+/hosts.yml: "
                                             r"all.hosts.h1.monitoring\)$"):
            refusing()
    h = host(tmp_path, [{**SVC, "port": 9100}])  # not monitored: no node_exporter there
    sglang_service.check(h, h["services"])


def test_a_service_on_a_routers_metrics_port_is_refused_naming_both(tmp_path):
    h = host(tmp_path, [{"name": "r", "kind": "router", "api_key": "rk-1", "workers": {"group": "all"}},
                        {**SVC, "port": 29000, "bind": "0.0.0.0", "api_key": "rk-1"}])
    for refusing in (lambda: sglang_service.check(h, h["services"][1:]),
                     lambda: router_role.check(h, h["services"][:1])):
        with pytest.raises(UsageError, match=r"h1: port 29000 is taken twice: by router 'r''s metrics \(\S+: "
                                             r"all.hosts.h1.services\[0\]\) and by sglang 'sglang' \(\S+: "
                                             r"all.hosts.h1.services\[1\]\)$"):
            refusing()


def test_two_services_on_one_port_are_refused_naming_both(tmp_path):
    h = host(tmp_path, [SVC, {**SVC, "name": "other"}])
    with pytest.raises(UsageError, match=r"port 30000 is taken twice: by sglang 'sglang' \(.*\) and by sglang 'other' "
                                         r"\(\S+/hosts.yml: all.hosts.h1.services\[1\]\)$"):
        sglang_service.check(h, h["services"])


# -- the simulator's auth, against real SGLang 0.5.23 ------------------------------------------

KEYS = [(None, None), ("k-1", None), (None, "a-1"), ("k-1", "a-1")]
HEADERS = [None, "Bearer k-1", "Bearer a-1", "bearer a-1", "Basic a-1", "Bearer wrong"]
PATHS = ["/configure_logging", "/update_weights_from_disk", "/load_lora_adapter", "/generate", "/server_info",
         "/v1/chat/completions", "/metrics", "/health_generate", "/ready"]


def sim_auth():
    import importlib.util
    from sandbox import provision
    path = provision.HERE / "sglang_sim" / "sglang" / "srt" / "utils" / "auth.py"
    spec = importlib.util.spec_from_file_location("sim_auth", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_simulator_guards_admin_routes_as_sglang_does():
    auth = sim_auth()
    assert auth.allowed("POST", "/configure_logging", None, None, None)  # no key at all: open
    assert not auth.allowed("POST", "/configure_logging", "Bearer k-1", "k-1", "a-1")  # the api key is not taken
    assert auth.allowed("POST", "/configure_logging", "Bearer a-1", "k-1", "a-1")
    assert auth.allowed("POST", "/generate", None, None, "a-1")  # an admin key alone leaves the rest open
    assert auth.allowed("GET", "/metrics", None, "k-1", "a-1")


@pytest.mark.slow
def test_the_simulators_auth_is_real_sglangs(tmp_path):
    """Every (keys, header, path) the simulator decides as real 0.5.23's decide_request_auth does,
    its admin routes are exactly the real http_server.py's ADMIN_OPTIONAL ones, and real
    /server_info's resolved arguments carry both keys (why an admin key alone is refused)."""
    from sandbox import real_sglang
    auth = sim_auth()
    cases = [(k, a, hdr, p) for k, a in KEYS for hdr in HEADERS for p in PATHS]
    program = """
import json, sys, re, importlib.util, pathlib
import sglang
root = pathlib.Path(sglang.__file__).parent / "srt"
spec = importlib.util.spec_from_file_location("auth", root / "utils" / "auth.py")
auth = importlib.util.module_from_spec(spec); sys.modules["auth"] = auth; spec.loader.exec_module(auth)
src = (root / "entrypoints" / "http_server.py").read_text()
admin = sorted(set(re.findall(r'@app\\.(?:api_route|get|post)\\("([^"]+)"[^\\n]*\\n'
                              r'@auth_level\\(AuthLevel\\.ADMIN_OPTIONAL\\)', src)))
out = []
for k, a, hdr, p in json.load(sys.stdin):
    level = auth.AuthLevel.ADMIN_OPTIONAL if p in admin else auth.AuthLevel.NORMAL
    out.append(auth.decide_request_auth(method="POST", path=p, authorization_header=hdr, api_key=k,
                                        admin_api_key=a, auth_level=level).allowed)
from sglang.srt.server_args import prepare_server_args
d = prepare_server_args(["--model-path", "/m", "--api-key", "k-1", "--admin-api-key", "a-1"]).resolved_dict()
print(json.dumps({"admin": admin, "allowed": out, "keys": [d["api_key"], d["admin_api_key"]]}))
"""
    res = subprocess.run([str(real_sglang.venv()), "-c", program], input=json.dumps(cases), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    real = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(real["admin"]) == auth.ADMIN_OPTIONAL
    assert [auth.allowed("POST", p, hdr, k, a) for k, a, hdr, p in cases] == real["allowed"]
    assert real["keys"] == ["k-1", "a-1"]


def test_open_admin_false_opens_nothing_and_a_router_refuses_it(tmp_path):
    with pytest.raises(UsageError, match="it needs an api_key"):
        check(tmp_path, bind="0.0.0.0", open_admin=False)
    h = host(tmp_path, [{"name": "r", "kind": "router", "api_key": "rk-1", "open_admin": False,
                         "workers": {"group": "all"}}, {**SVC, "port": 30001, "api_key": "rk-1", "bind": "0.0.0.0"}])
    with pytest.raises(UsageError, match="admin_api_key and open_admin are an SGLang server's"):
        router_role.check(h, [h["services"][0]])


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--port=9100"], ["--api-key", "k-123"],
                                  ["--admin-api-key=adm-456"]])
def test_extra_args_cannot_move_the_listener_or_carry_a_key(tmp_path, args):
    with pytest.raises(UsageError, match=rf"extra_args may not hold {args[0].split('=')[0]}: give bind, port"):
        check(tmp_path, extra_args=["--log-level", "info", *args])


def test_a_name_that_starts_with_127_is_not_loopback_and_a_short_key_is_refused(tmp_path):
    from specops.inventory import reach
    assert reach.loopback("127.0.0.2") and reach.loopback("::1") and reach.loopback("localhost")
    assert not reach.loopback("127.attacker.example") and not reach.loopback("0.0.0.0")
    with pytest.raises(UsageError, match="4 or more printable ASCII characters"):
        host(tmp_path, [{**SVC, "admin_api_key": "abc"}])
