"""The simulator (sandbox/sglang_sim) as the sim tests run it: a server on a loopback port with a
target and a draft of its own, a request to it, its /metrics parsed, and its request dump
(/configure_logging) turned on and read.  No fleet."""
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from support import ROOT

SIM = ROOT / "sandbox" / "sglang_sim"
KEY = "sk-metrics-test"
MODEL = "sim-model"
SPEC = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(tmp_path, *flags, draft=None, **env):
    """The simulator on a loopback port, its base URL; `draft`: keys added to the draft's config.json."""
    stub = tmp_path / "stub"
    stub.mkdir(exist_ok=True)
    (stub / "setproctitle.py").write_text("def setproctitle(title):\n    pass\n")  # not in .venv
    for name, cfg in (("target", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32}),
                      ("draft", {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
                                 **(draft or {})})):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tmp_path / "target"), "--port", str(port),
         "--served-model-name", MODEL, "--api-key", KEY, "--speculative-draft-model-path", str(tmp_path / "draft"),
         *flags], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": f"{stub}:{SIM}",
             "SGLANG_SIM_GPU_REGISTRY": str(tmp_path / "gpu"), "SGLANG_SIM_STARTUP_DELAY": "0",
             "SGLANG_SIM_TOK_S": "2000", "SGLANG_SIM_ACCEPT_FILE": str(tmp_path / "accept_rate"),
             "SGLANG_SIM_SLOW_FILE": str(tmp_path / "slow.json"), **env})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30  # bounds a broken start; a loaded box is slow
        while get(base + "/health")[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.05)
        yield base
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def get(url, **headers):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()
    except OSError:
        return None, None, b""


def generate(base, n, stream, words=3):
    """One /generate; its final meta_info, and (streaming) every event's completion_tokens."""
    body = {"text": " ".join(["w"] * words), "stream": stream, "sampling_params": {"max_new_tokens": n}}
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        if not stream:
            return json.load(r)["meta_info"], None
        events = [json.loads(line[6:]) for line in r if line.startswith(b"data: {")]
    return events[-1]["meta_info"], [e["meta_info"]["completion_tokens"] for e in events]


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """The text exposition format: ({name: HELP}, {name: TYPE}, [(name, labels, value)])."""
    helps, types, samples = {}, {}, []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, doc = line[7:].split(" ", 1)
            helps[name] = doc
        elif line.startswith("# TYPE "):
            name, typ = line[7:].split(" ")
            types[name] = typ
        else:
            m = SAMPLE.match(line)
            assert m, line
            pairs = LABEL.findall(m[2] or "")
            assert ",".join('%s="%s"' % p for p in pairs) == (m[2] or ""), line
            assert [k for k, _ in pairs] == sorted(k for k, _ in pairs), line  # prometheus_client sorts them
            samples.append((m[1], dict(pairs), float(m[3])))
    return helps, types, samples


def scrape(base):
    status, headers, body = get(base + "/metrics")
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(body.decode())


def value(samples, name, **labels):
    found = [v for n, lab, v in samples if n == name and lab == labels]
    assert len(found) == 1, (name, labels, [s for s in samples if s[0] == name])
    return found[0]


def tok(**extra):
    return {"model_name": MODEL, "engine_type": "unified", **extra}


def configure(base, body):
    req = urllib.request.Request(base + "/configure_logging", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def dumped(folder, count, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end and len(list(folder.glob("*.pkl"))) < count:
        time.sleep(0.1)
    return sorted(folder.glob("*.pkl"))
