"""--traffic on sandbox hosts: spec-tune and spec-bench measure on a sample of what the server
serves, taken through its own request dump (/configure_logging, as SGLang 0.5.23's).

The simulator's draft guesses one family of prompts badly (SGLANG_SIM_FAMILY_ACCEPT: requests
whose prompt holds "kotlin" run at alpha 0.3, others at 0.8; the bundled prompts hold none), so a
tune on the bundled prompts and one on production's traffic reach different winners, and the
oracle (sim_perf.steady_tok_s for that family) says which serves that traffic faster."""
import json
import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

from sandbox.oracle import sim_perf
from support import ROOT
from support.daytwo import Load
from support.spec_tune import LOAD, settings, tune
from support.traffic import ADMIN, KEY, KNOBS, PRODUCTION, SAMPLES, dump_folders, inventory, samples_left

pytestmark = pytest.mark.fleet


def until_dump_off(h, stop):
    """Set `stop` once the dump specops turned on (after this call) is off again (the server's log says so)."""
    told = len(dump_folders(h))

    def watch():
        while not stop.is_set():
            folders = dump_folders(h)
            if len(folders) > told + 1 and folders[-1] == "''":
                stop.set()
            time.sleep(0.5)
    threading.Thread(target=watch, daemon=True).start()


class Production(Load):
    """Production's traffic (its own family) until the dump specops turned on is off again."""

    def __init__(self, h, texts=PRODUCTION, limit=240):
        super().__init__([h.address], KEY, limit=limit, texts=texts, clients=4, max_new_tokens=48)
        self.h = h

    def __enter__(self):
        super().__enter__()
        until_dump_off(self.h, self.stop)
        return self


def served_tok_s(settings_):
    """The oracle: tok/s at concurrency 1 on production's traffic (its family's alpha)."""
    return sim_perf.steady_tok_s(sim_perf.family_env(KNOBS, "kotlin"), 1, settings_)


def test_a_tune_on_production_traffic_beats_one_on_the_bundled_prompts_and_leaves_nothing_behind(sandbox):
    h = sandbox.reset("t1")
    inv = inventory(sandbox, "t1")
    res = sandbox.inv("deploy", "--host", "t1", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]

    res, rep = tune(sandbox, "t1", inv)  # the bundled prompts: what the draft guesses well
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    bundled = settings(
        json.loads(h.path("/var/lib/specops/releases/current/tune.json").read_text())["sglang"]["winner"])

    with Production(h) as production:
        res, rep = tune(sandbox, "t1", inv, "--traffic", "200", "--traffic-wait", "120", "--apply", "--force",
                        timeout=1200)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert production.served.get(h.address, 0) >= 200, production.served
    assert "traffic sample: 2" in out and "ended by the count" in out, out[-3000:]
    stamps = sorted(p.name for p in h.path("/var/lib/specops/releases").iterdir() if p.name[0].isdigit())
    rec = json.loads(h.path(f"/var/lib/specops/releases/{stamps[-2]}/tune.json").read_text())["sglang"]
    traffic = settings(rec["winner"])
    # measured on production's own traffic (the oracle of its family), the traffic's winner serves it faster
    assert served_tok_s(traffic) > served_tok_s(bundled) * 1.05, (traffic, bundled)
    assert bundled != traffic
    # what runs now is the traffic's winner
    info = json.loads(h.run("curl", "-s", "-H", f"Authorization: Bearer {KEY}",
                            "http://127.0.0.1:30000/server_info").stdout)
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == traffic
    # the record names the sample by digest, size and span, never by a prompt
    assert rec["load"]["prompts"] == "traffic sample" and rec["load"]["traffic"]["requests"] >= 200
    whole = json.dumps(rec) + json.dumps(rep)
    assert not any(text.split(":")[0] in whole for text in PRODUCTION), "a prompt reached the record"
    assert "Kotlin" not in whole and "kotlin" not in whole.lower().replace("sim_family", "")

    # the sample is gone; the dump is off: more traffic writes no dump file
    assert samples_left(h) == []
    assert dump_folders(h)[-1] == "''"
    with Load([h.address], KEY, limit=6, texts=PRODUCTION, clients=4, max_new_tokens=8) as more:
        time.sleep(6)
    assert more.served.get(h.address, 0) >= 30, more.served
    assert samples_left(h) == [] and h.run("sh", "-c", "find / -xdev -name '*.pkl' -newer /etc/hostname "
                                                      "2>/dev/null", check=False).stdout.split() == []


class Pwn:
    """Loading this runs a command as whoever loads it: what a pickle can do."""
    def __reduce__(self):
        return (os.system, ("touch /run/pwned",))


def plant(h, d, kind):
    """Put a file the server did not write into the capture's dump directory `d`, as root could."""
    if kind == "a link":
        os.symlink("/etc/shadow", h.path(d) / "2026-01-01_00-00-00.pkl")
    elif kind == "a file not root's":
        h.path(d).joinpath("x.pkl").write_bytes(pickle.dumps({"requests": [Pwn()]}))
        h.run("chown", "65534", f"{d}/x.pkl")
    else:
        h.path(d).joinpath("x.pkl").write_bytes(pickle.dumps({"requests": [Pwn()]}))
        h.run("chown", "0:0", f"{d}/x.pkl")
        h.run("chmod", "0640", f"{d}/x.pkl")


PLANTS = {"a link": "a symbolic link", "a file not root's": "owned by uid 65534, not root",
          "not a pickle of a dump": "is not (GenerateReqInput, output, created, finished)"}


@pytest.mark.security("dump-file", "a file planted in a traffic capture's dump directory while it runs: a link to "
                                   "/etc/shadow, another user's pickle, a root-owned pickle that runs a command when "
                                   "loaded (refused; nothing of it loaded or run)")
@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_a_dump_file_not_the_servers_own_is_refused_and_nothing_of_it_is_loaded(sandbox, kind):
    h = sandbox.reset("t3")
    inv = inventory(sandbox, "t3")
    assert sandbox.inv("deploy", "--host", "t3", inventory=inv).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "spec-bench", "--host", "t3", "--traffic", "100",
                             "--traffic-wait", "60", "--concurrency", "1", "--requests", "4"],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, **sandbox.login_env(), "SPECOPS_INVENTORY": str(inv)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            chunk = [p for p in samples_left(h) if p.endswith("/d0")]
            if chunk:
                break
            time.sleep(0.3)
        assert chunk, "no capture started"
        plant(h, chunk[0], kind)
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode != 0, out[-3000:]
    assert PLANTS[kind] in out, out[-3000:]
    assert h.run("test", "-e", "/run/pwned", check=False).returncode == 1  # nothing in it ran
    assert samples_left(h) == [] and dump_folders(h)[-1] == "''"
    assert h.run("systemctl", "is-active", "sglang", check=False).stdout.strip() == "active"


def test_a_server_older_than_the_dump_specops_reads_is_refused_before_anything_changes(sandbox):
    h = sandbox.reset("t4")
    inv = inventory(sandbox, "t4")
    assert sandbox.inv("deploy", "--host", "t4", inventory=inv).returncode == 0
    # what an older release's install looks like to a reader of versions (the dist-info's name)
    h.run("sh", "-c", "cd /opt/sglang/venv/lib/python3*/site-packages && mv sglang-0.5.23.dist-info "
                      "sglang-0.5.22.dist-info")
    told = dump_folders(h)
    res = sandbox.inv("spec-tune", "--host", "t4", "--traffic", "50", "--traffic-wait", "20", *LOAD, inventory=inv)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "SGLang 0.5.22 has no request dump specops reads: --traffic needs SGLang 0.5.23 or later" in out, out[-2000:]
    assert dump_folders(h) == told and samples_left(h) == []


@pytest.mark.security("dump-foreign", "another user's request dump on when a --traffic run starts (named, left on; "
                                      "nothing captured)")
def test_a_request_dump_specops_did_not_start_is_named_and_left_alone(sandbox):
    h = sandbox.reset("t5")
    inv = inventory(sandbox, "t5", admin_api_key=ADMIN)
    assert sandbox.inv("deploy", "--host", "t5", inventory=inv).returncode == 0
    # a colleague's dump, as SGLang's own configure_logging script starts one
    h.run("curl", "-sf", "-X", "POST", "-H", f"Authorization: Bearer {ADMIN}", "-H", "Content-Type: application/json",
          "-d", json.dumps({"dump_requests_folder": "/tmp/sglang_request_dump", "dump_requests_threshold": 1000}),
          "http://127.0.0.1:30000/configure_logging")
    res = sandbox.inv("spec-bench", "--host", "t5", "--traffic", "20", "--traffic-wait", "20", inventory=inv)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "a request dump specops did not start is on, into /tmp/sglang_request_dump: left alone" in out, out[-2000:]
    assert dump_folders(h)[-1] == "'/tmp/sglang_request_dump'" and samples_left(h) == []
    # once its owner turns it off, spec-bench measures on the traffic, and keeps no prompt of it
    h.run("curl", "-sf", "-X", "POST", "-H", f"Authorization: Bearer {ADMIN}", "-H", "Content-Type: application/json",
          "-d", json.dumps({"dump_requests_folder": ""}), "http://127.0.0.1:30000/configure_logging")
    fetched = sandbox.tmp / "fetched.json"
    # what an agent killed outright left: the next --traffic run removes it
    h.run("sh", "-c", f"mkdir -p -m 0700 {SAMPLES}/sglang.deadbeef "
                      f"&& echo '[]' > {SAMPLES}/sglang.deadbeef/sample.json")
    with Production(h):
        res = sandbox.inv("spec-bench", "--host", "t5", "--traffic", "30", "--traffic-wait", "60", "--concurrency",
                          "1", "--requests", "8", "--fetch-sample", str(fetched), inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    perf = h.path("/var/lib/specops/releases/current/perf.json").read_text()
    assert json.loads(perf)["sglang"]["load"]["prompts"] == "traffic sample" and "Kotlin" not in perf
    # --fetch-sample: the prompts users sent, on the controller, the owner's alone
    assert oct(fetched.stat().st_mode & 0o777) == "0o600" and "Kotlin coroutine" in fetched.read_text()
    assert samples_left(h) == []


OTHER = "/models/tiny-llama-eagle3-kotlin"
KOTLIN_DRAFT = {"sim_accept_rate": 0.6, "sim_family_accept_rate": {"kotlin": 0.85}}  # trained on that traffic


class Chats(Load):
    """Production's traffic as chat requests: each reaches the dump as its templated prompt's ids."""

    def request(self, text):
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": text}],
                                        "max_completion_tokens": self.max_new_tokens}


def test_which_draft_pays_on_what_is_served_now_is_one_command(sandbox):
    h = sandbox.reset("t5")
    h.run("cp", "-a", "/models/tiny-llama-eagle3", OTHER)
    config = json.loads(h.path(f"{OTHER}/config.json").read_text())
    h.path(f"{OTHER}/config.json").write_text(json.dumps({**config, **KOTLIN_DRAFT}))
    space = {"num_steps": [1, 3], "eagle_topk": [1], "num_draft_tokens": [2, 4], "drafts": [OTHER]}
    inv = inventory(sandbox, "t5", tune=space)
    assert sandbox.inv("deploy", "--host", "t5", inventory=inv).returncode == 0
    res, _ = tune(sandbox, "t5", inv)
    assert res.returncode == 0, res.stdout[-3000:]
    current = "/var/lib/specops/releases/current/tune.json"
    assert json.loads(h.path(current).read_text())["sglang"]["winner_draft"] in (None, "/models/tiny-llama-eagle3")
    with Chats([h.address], KEY, limit=240, texts=PRODUCTION, clients=4, max_new_tokens=48) as production:
        until_dump_off(h, production.stop)
        res, _ = tune(sandbox, "t5", inv, "--traffic", "60", "--traffic-wait", "120")
    assert res.returncode == 0, res.stdout[-3000:]
    rec = json.loads(h.path(current).read_text())["sglang"]
    assert rec["winner_draft"] == OTHER, rec["verdict"]
    # every request came as a chat, so as token ids: the family was found in them, not in text
    assert rec["load"]["traffic"]["token_ids"] == rec["load"]["traffic"]["requests"] >= 60, rec["load"]
    by = {d["draft"]: d for d in rec["drafts"]}
    kotlin = sim_perf.family_env(sim_perf.with_draft(KNOBS, KOTLIN_DRAFT), "kotlin")
    own = sim_perf.family_env(KNOBS, "kotlin")
    assert sim_perf.steady_tok_s(kotlin, 1, settings(rec["winner"])) > \
        1.5 * sim_perf.steady_tok_s(own, 1, settings(by["/models/tiny-llama-eagle3"]["best"]))
    assert samples_left(h) == []
