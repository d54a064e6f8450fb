"""A traffic sample's pure parts, no fleet: the journal line that says which dump is on, the admin
key, the agent's and the controller's refusals, the sample read back as it was taken, the local
copy, the load client's request for a sampled prompt, and the remedy the alerts name (the dump
file's reader: test_traffic_dumpfile.py)."""
import json
import os
import stat
import time
import types

import pytest

from specops import protocol
from specops.agent.bench import specbench, traffic
from specops.agent.host import ActionError
from specops.errors import SpecopsError, UsageError
from specops.fleetwide.payoff import remedy
from specops.flows import traffic as flow


def test_which_dump_is_on_is_read_from_the_servers_own_log_line(monkeypatch):
    lines = ["[2026-12-07 10:00:00] Config logging: obj=ConfigureLoggingReq(rid=None, http_worker_ipc=None, "
             "log_requests=None, log_requests_level=None, log_requests_format=None, log_level=None, "
             "dump_requests_folder='/tmp/sglang_request_dump', dump_requests_threshold=1000, crash_dump_folder=None, "
             "dump_requests_exclude_meta_keys=None)",
             "[2026-12-07 10:00:01] Config logging: obj=ConfigureLoggingReq(rid=None, http_worker_ipc=None, "
             "log_requests=True, log_requests_level=None, log_requests_format=None, log_level=None, "
             "dump_requests_folder=None, dump_requests_threshold=None, crash_dump_folder=None, "
             "dump_requests_exclude_meta_keys=None)"]
    # a user's prompt, logged by --log-requests, that carries the line: not at a line's start, not read
    forged = ("[2026-12-07 10:00:02] Receive: obj=GenerateReqInput(text='Config logging: obj=ConfigureLoggingReq("
              "dump_requests_folder=\\'/var/lib/specops/traffic/sglang.ffffffff\\')')")
    outs = iter([(0, "abc\n"), (0, "\n".join(lines + [forged]))])
    monkeypatch.setattr(traffic, "run_quiet", lambda argv, timeout=None: next(outs))
    assert traffic.current_folder("sglang") == "/tmp/sglang_request_dump"  # a later call that set no folder keeps it
    outs = iter([(0, "abc\n"), (0, lines[0] + "\n" + lines[0].replace("'/tmp/sglang_request_dump'", "''"))])
    assert traffic.current_folder("sglang") == ""
    assert traffic.ours("/var/lib/specops/traffic/sglang.0a1b2c3d/d0", "sglang")
    assert not traffic.ours("/var/lib/specops/traffic/sglang-b.0a1b2c3d/d0", "sglang")
    assert not traffic.ours("/tmp/sglang_request_dump", "sglang") and not traffic.ours("", "sglang")


def test_the_admin_key_goes_only_to_the_units_own_listener(monkeypatch):
    asked = []
    monkeypatch.setattr(traffic.asking, "call", lambda *a, **k: asked.append(a) or (200, b""))
    svc = protocol.ServiceCheck(name="sglang", port=30000,
                                endpoints=protocol.Endpoints(configure_logging="/configure_logging"))
    with pytest.raises(ActionError, match="port 30000 is served by pid 7"):
        traffic._post(svc, {"dump_requests_folder": ""}, lambda: "port 30000 is served by pid 7")
    assert asked == []
    monkeypatch.setattr(traffic.asking, "call", lambda *a, **k: (404, b""))
    with pytest.raises(ActionError, match="has no /configure_logging .SGLang 0.5.23 and later have it"):
        traffic._post(svc, {}, lambda: None)


def test_the_admin_key_is_the_admin_one_where_there_is_one(tmp_path, monkeypatch):
    env = tmp_path / "sglang.env"
    monkeypatch.setattr(traffic.asking, "env_file", lambda name: str(env))
    env.write_text('SGLANG_SPECOPS_API_KEY="user-key"\n')
    assert traffic.asking.admin_key("sglang") == "user-key"
    env.write_text('SGLANG_SPECOPS_API_KEY="user-key"\nSGLANG_SPECOPS_ADMIN_API_KEY="admin-key"\n')
    assert traffic.asking.admin_key("sglang") == "admin-key"


def test_a_sample_prompt_goes_to_generate_with_its_own_max_new_tokens():
    svc = protocol.ServiceCheck(name="s", port=1)
    path, body, _ = specbench.generate_request(svc, {"input_ids": [5, 6], "max_new_tokens": 9}, 128)
    assert path == "/generate" and body["input_ids"] == [5, 6] and "text" not in body
    assert body["sampling_params"]["max_new_tokens"] == 9
    _, body, _ = specbench.generate_request(svc, {"text": "hi", "max_new_tokens": None}, 128)
    assert body["text"] == "hi" and body["sampling_params"]["max_new_tokens"] == 128
    assert specbench.sendable({"input_ids": [1], "max_new_tokens": 3}) and not specbench.sendable({"input_ids": "x"})
    # one rule picks a load's share of a prompt file and of a sample
    prompts = list(range(50))
    assert protocol.sampled(prompts, 10, 3) == protocol.sampled(prompts, 10, 3) != protocol.sampled(prompts, 10, 4)


def test_the_options_and_what_is_refused_before_anything_changes(monkeypatch):
    assert flow.Traffic.parse(None) is None
    assert flow.Traffic.parse("200", "60", "s.json") == flow.Traffic(200, 60.0, "s.json")
    for args, said in (((None, "60"), "go with --traffic N"), (("0",), "--traffic: give a whole number"),
                       (("x",), "--traffic")):
        with pytest.raises(UsageError, match=said):
            flow.Traffic.parse(*args)
    assert flow.asked({"tune": {"traffic": 50}}, None) == flow.Traffic(50)
    host = types.SimpleNamespace(name="h", vars={})
    monkeypatch.setattr(flow.kinds, "venv_of", lambda h: "/opt/sglang/venv")
    facts = types.SimpleNamespace(venv=lambda path: {"packages": {"sglang": "0.5.22"}})
    run = types.SimpleNamespace(host=host)
    base = {"name": "sglang", "model_path": "/m", "port": 30000}
    with pytest.raises(SpecopsError, match="SGLang 0.5.22 has no request dump specops reads: --traffic needs "
                                           "SGLang 0.5.23 or later"):
        flow.refuse(run, base, facts)
    with pytest.raises(SpecopsError, match="runs as svc: its dump files would be svc's"):
        flow.refuse(run, {**base, "user": "svc"}, facts)
    with pytest.raises(SpecopsError, match="is a router"):
        flow.refuse(run, {"name": "r", "kind": "router", "port": 30010}, facts)
    flow.refuse(run, base, types.SimpleNamespace(venv=lambda path: {"packages": {"sglang": "0.5.25"}}))


def test_the_record_keeps_the_samples_identity_never_a_prompt():
    sample = protocol.TrafficSample(path="/var/lib/specops/traffic/s.1/sample.json", sha256="ab" * 32, requests=3,
                                    bytes=2048, first=time.time() - 60, last=time.time(), files=1, ended="count",
                                    prompts=[{"text": "secret prompt", "max_new_tokens": 4}])
    kept = json.dumps(flow.identity(sample))
    assert "secret" not in kept and "ab" * 32 in kept and '"requests": 3' in kept
    assert flow.span(sample) == "3 requests (2 KiB) served over 60 s"


def test_a_fetched_sample_is_0600_and_never_written_through_a_link(tmp_path):
    out = tmp_path / "sample.json"
    flow.write_local(str(out), [{"text": "a", "max_new_tokens": 2}])
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and json.loads(out.read_text())[0]["text"] == "a"
    (tmp_path / "elsewhere").write_text("keep")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link.json")
    with pytest.raises(SpecopsError, match="--fetch-sample"):
        flow.write_local(str(tmp_path / "link.json"), [])
    assert (tmp_path / "elsewhere").read_text() == "keep"


def test_the_alert_and_status_name_a_tune_on_the_traffic():
    assert remedy("t1") == "inv spec-tune --host t1 --traffic"


def test_a_sample_is_read_only_from_specops_s_directory_and_as_it_was_taken(tmp_path, monkeypatch):
    from specops.agent.bench import dumpdir
    from specops.agent.host import sha256
    monkeypatch.setattr(dumpdir, "TRAFFIC_DIR", str(tmp_path))
    (tmp_path / "sglang.1").mkdir()
    path = tmp_path / "sglang.1" / "sample.json"
    path.write_text('[{"text": "a", "max_new_tokens": 2}]')
    digest = sha256(path.read_bytes()).hexdigest()
    assert dumpdir.read_sample(str(path), digest) == [{"text": "a", "max_new_tokens": 2}]
    path.write_text('[{"text": "b", "max_new_tokens": 2}]')
    with pytest.raises(ActionError, match="gone or changed"):
        dumpdir.read_sample(str(path), digest)
    for elsewhere in ("/etc/sample.json", str(tmp_path / "sglang.1" / "other.json"),
                      str(tmp_path) + "/sglang.1/../../etc/sample.json"):
        with pytest.raises(ActionError, match="not a traffic sample"):
            dumpdir.read_sample(elsewhere, digest)


def test_the_agent_refuses_a_user_service_and_a_dump_it_did_not_start(monkeypatch):
    req = protocol.TrafficCapture(service=protocol.ServiceCheck(
        name="sglang", port=30000, endpoints=protocol.Endpoints(configure_logging="/configure_logging")),
        unit="sglang", count=10)
    monkeypatch.setattr(traffic, "run_quiet", lambda argv, timeout=None: (0, "alice\n"))
    with pytest.raises(ActionError, match="runs as alice"):
        traffic.refuse_unless_capturable(req, lambda: None)
    monkeypatch.setattr(traffic, "run_quiet", lambda argv, timeout=None: (0, "\n"))
    monkeypatch.setattr(traffic, "current_folder", lambda unit: "/tmp/theirs")
    with pytest.raises(ActionError, match="specops did not start is on, into /tmp/theirs: left alone"):
        traffic.refuse_unless_capturable(req, lambda: None)
    monkeypatch.setattr(traffic, "current_folder", lambda unit: "/var/lib/specops/traffic/sglang.0a0b0c0d/d3")
    traffic.refuse_unless_capturable(req, lambda: None)  # its own, left by a killed run: taken over
    with pytest.raises(ActionError, match="not ours"):
        traffic.refuse_unless_capturable(req, lambda: "not ours")
    req = protocol.replace(req, service=protocol.ServiceCheck(name="r", port=1))
    with pytest.raises(ActionError, match="has no request dump"):
        traffic.refuse_unless_capturable(req, lambda: None)


def test_traffic_and_a_prompt_file_are_one_or_the_other(monkeypatch):
    from specops.flows import tuning
    with pytest.raises(UsageError, match="give it or --prompts, not both"):
        tuning.Ask.parse(budget=None, at=None, mean=False, max_itl_p99_ms=None, concurrency=None, requests=None,
                         max_new_tokens=None, prompts="files/prompts.json", traffic=flow.Traffic(10))
    # the inventory's tune.traffic gives way to a prompt file named on the command line
    assert flow.asked({"tune": {"traffic": 50}}, None, prompts="p.jsonl") is None
    host = types.SimpleNamespace(name="h")
    monkeypatch.setattr(flow.kinds, "venv_of", lambda h: "/v")
    facts = types.SimpleNamespace(venv=lambda path: {"packages": {"sglang": "0.5.23rc1"}})
    base = {"name": "sglang", "model_path": "/m", "port": 30000}
    flow.refuse(types.SimpleNamespace(host=host), base, facts)
    with pytest.raises(SpecopsError, match="runs 2 tokenizer workers"):
        flow.refuse(types.SimpleNamespace(host=host), {**base, "extra_args": ["--tokenizer-worker-num=2"]}, facts)
    flow.refuse(types.SimpleNamespace(host=host), {**base, "extra_args": ["--tokenizer-worker-num", "1"]}, facts)


def test_a_fetched_sample_over_an_older_file_is_the_owners_alone(tmp_path):
    out = tmp_path / "sample.json"
    out.write_text("old")
    out.chmod(0o644)
    flow.write_local(str(out), [])
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text() == "[]"
