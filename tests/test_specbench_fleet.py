"""spec-bench on a sandbox host: the load client on the host, the baseline in a GPU window as a
transient unit, the service always restored, the result kept with the release.

The simulator's performance model (sandbox/sglang_sim/sglang/sim_perf.py) makes both outcomes
real: a good draft pays off, a poor one is slower than no draft at all."""
import json
import signal
import subprocess
import sys
import time

import pytest

from sandbox.provision import sandbox_service
from specops.layout import LOCK_DIR
from support import ROOT
from support.files import load_json
from support.hosts import MANAGED, sha256_on

pytestmark = pytest.mark.fleet
GOOD = {"SGLANG_SIM_TOK_S": "400", "SGLANG_SIM_ACCEPT_LENGTH": "3.2", "SGLANG_SIM_DRAFT_COST": "0.15"}
POOR = {"SGLANG_SIM_TOK_S": "400", "SGLANG_SIM_ACCEPT_LENGTH": "1.2", "SGLANG_SIM_DRAFT_COST": "0.3"}
LOAD = ("--concurrency", "1,4", "--requests", "8", "--max-new-tokens", "32")


def setup(sandbox, name, knobs, **over):
    svc = sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "1", **knobs}, **over)
    inv = sandbox.inventory({name: {"services": [svc]}})
    res = sandbox.inv("deploy", "--host", name, inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]
    return inv


def bench(sandbox, name, inv, *args):
    report = sandbox.tmp / f"b{time.monotonic_ns()}.json"
    res = sandbox.inv("spec-bench", "--host", name, "--json", str(report), *LOAD, *args, inventory=inv, timeout=600)
    return res, (load_json(report)["hosts"][name] if report.exists() else None)


def started(h):
    return h.run("systemctl", "show", "sglang", "-p", "ExecMainStartTimestampMonotonic,MainPID").stdout


def test_a_good_draft_pays_off_and_the_service_is_untouched_by_the_baseline(sandbox):
    """At SGLang's --stream-interval 4 (issue 24 item 4): one event carries several verify steps,
    so the accept length holds only if it is SGLang's own count (completion tokens ÷ spec_verify_ct)."""
    h = sandbox.reset("t1")
    inv = setup(sandbox, "t1", GOOD, extra_args=["--stream-interval", "4"])
    before, first_run = sha256_on(h, *MANAGED), started(h)
    res, rep = bench(sandbox, "t1", inv, "--baseline")
    assert res.returncode == 0, res.stdout[-4000:]
    gain = rep["spec_bench"]["speedup"]
    print(f"\ngood draft: {rep['spec_bench']['verdict']}; accept length {rep['spec_bench']['accept_length']}")
    assert gain["1"] > 1.3 and "speculative decoding: " in res.stdout, res.stdout[-2000:]
    assert rep["spec_bench"]["accept_length"]["1"] == pytest.approx(3.2, rel=0.1)
    # The managed files are as deployed; the baseline ran as its own transient unit, never as sglang.
    assert sha256_on(h, *MANAGED) == before
    baseline_log = h.run("journalctl", "-u", "specops-baseline-sglang", "-o", "cat", "--no-pager").stdout
    assert "server_args=" in baseline_log and "'speculative_algorithm': None" in baseline_log
    service_log = h.run("journalctl", "-u", "sglang", "-o", "cat", "--no-pager").stdout
    assert "'speculative_algorithm': None" not in service_log
    # GPUs proven free before the baseline and after it; the service restarted and verified.
    out = res.stdout
    assert out.index("sglang: stopped in") < out.index("baseline: ready") < out.index("baseline stopped; freed")
    assert "GPU 0:" in out[out.index("baseline stopped; freed"):].split("\n")[0]
    after = out[out.index("restarting sglang"):]
    assert started(h) != first_run and "/generate " in after and "FAILED" not in after
    assert "sglang verified" in rep["notes"]
    assert h.run("systemctl", "is-active", "specops-baseline-sglang", check=False).stdout.strip() != "active"
    # Kept with the release, and shown by `inv releases`.
    perf = json.loads(h.run("sh", "-c", "cat /var/lib/specops/releases/current/perf.json").stdout)["sglang"]
    assert perf["baseline_argv"] and not any(a.startswith("--speculative") for a in perf["baseline_argv"])
    assert perf["speedup"] == gain and perf["spec"][0]["raw"] and perf["baseline"][0]["figures"]["output_tok_s"] > 0
    # The server streamed as asked: fewer events than verify steps, in every measured request
    assert "'stream_interval': 4" in service_log
    raw = [r for lv in perf["spec"] for r in lv["raw"]]
    assert raw and all(len(r["events"]) < r["spec_verify_ct"] for r in raw), raw[0]
    # SGLang puts the spec stats in meta_info only with speculation on: the baseline has none.
    assert all("accept_length" not in lv["figures"] for lv in perf["baseline"])
    assert all(lv["figures"]["accept_length"] > 1 for lv in perf["spec"])
    listing = sandbox.inv("releases", "--host", "t1", inventory=inv)
    assert f"speedup {gain['1']:.2f}x @1" in listing.stdout, listing.stdout


def test_a_poor_draft_is_called_slower(sandbox):
    h = sandbox.reset("t2")
    inv = setup(sandbox, "t2", POOR)
    res, rep = bench(sandbox, "t2", inv, "--baseline")
    assert res.returncode == 0, res.stdout[-3000:]
    print(f"\npoor draft: {rep['spec_bench']['verdict']}; accept length {rep['spec_bench']['accept_length']}")
    assert rep["spec_bench"]["speedup"]["1"] < 0.8, rep["spec_bench"]
    assert "slower at every level" in res.stdout or "slower from" in res.stdout
    assert h.run("systemctl", "is-active", "sglang").stdout.strip() == "active"


def test_a_baseline_that_fails_to_start_still_restores_the_service(sandbox):
    h = sandbox.reset("t2")
    inv = setup(sandbox, "t2", {**GOOD, "SGLANG_SIM_FAIL_WITHOUT_SPEC": "1"})
    first_run = started(h)
    res, rep = bench(sandbox, "t2", inv, "--baseline")
    assert res.returncode == 1 and "the baseline server exited before it was ready" in rep["error"], res.stdout[-3000:]
    after = res.stdout[res.stdout.index("restarting sglang"):]
    assert "/generate " in after and "sglang verified" in rep["notes"] and started(h) != first_run
    assert "baseline stopped; freed" in res.stdout
    assert h.run("systemctl", "is-active", "specops-baseline-sglang", check=False).stdout.strip() != "active"


def test_ctrl_c_during_the_baseline_restores_the_service_on_every_host(sandbox):
    """Two hosts in parallel: Ctrl-C lands in the controller's main thread; each host's run gets
    it too and restores its service (a lone host's run is the main thread itself)."""
    hosts = {n: sandbox.reset(n) for n in ("t3", "t5")}
    svc = sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "1", **GOOD})
    inv = sandbox.inventory({n: {"services": [svc]} for n in hosts})
    res = sandbox.inv("deploy", "--group", "fleet", inventory=inv)
    assert res.returncode == 0, res.stdout[-3000:]
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "spec-bench", "--group", "fleet", "--baseline",
                             "--concurrency", "1,4", "--requests", "80", "--max-new-tokens", "32"],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**__import__("os").environ, "SPECOPS_INVENTORY": str(inv)})
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "baseline: ready" in line:
            time.sleep(1)
            proc.send_signal(signal.SIGINT)
            break
    out = "".join(seen) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 130 and "interrupted" in out, out[-3000:]
    stopped = 0
    for name, h in hosts.items():
        mine = "".join(line for line in out.splitlines(True) if line.startswith(name + " "))
        if "sglang: stopped in" in mine:  # its GPU window had begun: it must have been closed
            stopped += 1
            after = mine[mine.index("restarting sglang"):]
            assert "/generate " in after and "FAILED" not in after, mine[-3000:]
        assert h.run("systemctl", "is-active", "sglang").stdout.strip() == "active"
        assert h.run("systemctl", "is-active", "specops-baseline-sglang", check=False).stdout.strip() != "active"
        assert h.run("test", "-e", LOCK_DIR, check=False).returncode == 1  # the lock was given back
        # cut short, not run to its end: no result was kept
        assert h.run("test", "-e", "/var/lib/specops/releases/current/perf.json", check=False).returncode == 1
    assert stopped >= 1, out[-3000:]


GATE_LOAD = {"concurrency": [1], "requests": 12, "max_new_tokens": 48}


def deploy_bench(sandbox, name, knobs, gate):
    svc = sandbox_service(env={"SGLANG_SIM_STARTUP_DELAY": "1", **knobs}, gate={**gate, "load": GATE_LOAD})
    inv = sandbox.inventory({name: {"services": [svc]}})
    report = sandbox.tmp / f"d{time.monotonic_ns()}.json"
    res = sandbox.inv("deploy", "--host", name, "--bench", "--json", str(report), inventory=inv, timeout=600)
    return res, (load_json(report)["hosts"][name] if report.exists() else None)


def serving_knobs(h):
    return h.run("systemctl", "show", "sglang", "-p", "Environment").stdout


def test_deploy_bench_undoes_a_release_below_its_gate(sandbox):
    """The 0.61x case: a poor draft is refused by min_speedup 1.0 and rolled back, verified.
    Issue 24's rough edges, each kept in `wrong` and asserted at the end (so that one run shows
    every one of them): a gate that passes says so with its figures; the recap says once that
    sglang verified (its baseline restarted it and verified it again); `inv releases` into a pipe
    shows the undone release's whole reason; a no-op deploy below its gate says nothing was undone."""
    wrong = []
    h = sandbox.reset("t4")
    res, rep = deploy_bench(sandbox, "t4", GOOD, {"min_speedup": 1.0})
    assert res.returncode == 0 and "sglang verified" in rep["notes"], res.stdout[-3000:]
    perf = json.loads(h.run("sh", "-c", "cat /var/lib/specops/releases/current/perf.json").stdout)["sglang"]
    spec, base = perf["spec"][0]["figures"]["output_tok_s"], perf["baseline"][0]["figures"]["output_tok_s"]
    passed = (f"t4           sglang: gate passed: speedup {perf['speedup']['1']:.2f}x at concurrency 1 ({spec:.1f} "
              f"tok/s with speculation, {base:.1f} without) meets min_speedup 1.0\n")
    if passed not in res.stdout:
        wrong.append(f"no line {passed!r} in: {res.stdout[-1500:]}")
    recap = res.stdout[res.stdout.index("\nRECAP"):]
    if recap.count("sglang verified") != 1 or "sglang gate passed" not in recap:
        wrong.append(f"the recap: {recap}")
    good = serving_knobs(h)
    res, rep = deploy_bench(sandbox, "t4", POOR, {"min_speedup": 1.0})
    assert res.returncode == 1 and "rolled back" in rep["notes"], res.stdout[-3000:]
    assert "gate: speedup 0." in rep["error"] and "is below min_speedup 1.0" in rep["error"], rep["error"]
    assert "tok/s with speculation" in rep["error"] and ", verified" in rep["error"]
    print(f"\ngate refused: {rep['error']}")
    assert serving_knobs(h) == good and h.run("systemctl", "is-active", "sglang").stdout.strip() == "active"
    why = rep["error"].split("; rolled back to ")[0]
    listing = sandbox.inv("releases", "--host", "t4", inventory=sandbox.tmp / "inventory").stdout  # a pipe
    if not [line for line in listing.splitlines() if "rolled-back" in line and line.endswith("  " + why)]:
        wrong.append(f"no rolled-back release ending with {why!r} in: {listing}")
    # The same release again (a no-op), held to a gate it cannot meet: nothing of it to undo.
    res, rep = deploy_bench(sandbox, "t4", GOOD, {"min_accept_length": 50})
    assert res.returncode == 1 and not [c for c in rep["changes"] if c["changed"]], res.stdout[-3000:]
    assert "gate: accept length" in rep["error"] and "is below min_accept_length 50" in rep["error"], rep["error"]
    assert "rolled back" not in rep["notes"] and serving_knobs(h) == good
    if not rep["error"].endswith("; nothing to undo: this deploy changed nothing"):
        wrong.append(f"a no-op deploy's error: {rep['error']}")
    # What the gate measured stays with the release it refused; the page shows it, marked (issue 24:
    # the page showed "-" for it).
    page = sandbox.tmp / f"r{time.monotonic_ns()}.html"
    inv = sandbox.inventory({"t4": {"services": [sandbox_service()]}})  # the report reads the releases only
    res = sandbox.inv("report", "--host", "t4", "--out", str(page), inventory=inv)
    assert res.returncode == 0, res.stdout + res.stderr
    row = next(line for line in page.read_text().splitlines() if "<td>rolled-back</td>" in line)
    assert "<td data-rolled-back>speculative decoding: 0." in row and "(measured, then rolled back)" in row, row
    assert not wrong, "\n".join(wrong)


def current_figures(h):
    """The figures at concurrency 1 that the current release's perf.json keeps."""
    perf = json.loads(h.run("cat", "/var/lib/specops/releases/current/perf.json").stdout)["sglang"]
    return next(lv["figures"] for lv in perf["spec"] if lv["concurrency"] == 1)


def test_a_release_slower_than_the_last_is_undone_and_a_little_slower_one_kept(sandbox):
    """max_regression_pct, against the release being replaced.  The releases differ in tokens per
    step (the simulator's accept length), not in how long a step takes: a request's 48 tokens take
    15 steps at 3.2, 16 at 3.0 (6% slower), 32 at 1.5 (53% slower) and 48 at 1.0 (69% slower).  The drops are fixed by
    counts; a loaded machine, which stretches the steps of both releases alike, cannot bring them
    near the gate, set wide between them (it once measured a 5% drop in the step time as 12%).
    Where the threshold lies exactly is test_specbench.py's, on fixed figures."""
    h = sandbox.reset("t5")
    gate = {"max_regression_pct": 45}
    knobs = {**GOOD, "SGLANG_SIM_TOK_S": "100"}  # 15 ms steps: long beside a loaded machine's delays
    res, rep = deploy_bench(sandbox, "t5", knobs, gate)
    assert res.returncode == 0, res.stdout[-3000:]
    first = current_figures(h)
    assert first["accept_length"] == pytest.approx(3.2)  # completion tokens ÷ verify steps: counted
    res, rep = deploy_bench(sandbox, "t5", {**knobs, "SGLANG_SIM_ACCEPT_LENGTH": "1.0"}, gate)  # 48 steps, not 15
    assert res.returncode == 1 and "rolled back" in rep["notes"], res.stdout[-3000:]
    # Compared with the release it was to replace: that release's recorded figure, by the gate's rule.
    assert f"% below the previous release's {first['output_tok_s']:.1f} (max_regression_pct 45)" in rep["error"], \
        rep["error"]
    print(f"\ngate refused: {rep['error']}")
    assert "SGLANG_SIM_ACCEPT_LENGTH=3.2" in serving_knobs(h)
    # 32 steps: 53% below the current release, yet faster than the one just undone, whose figures
    # are kept too: compared with the newest measured release instead, it would be kept (review).
    res, rep = deploy_bench(sandbox, "t5", {**knobs, "SGLANG_SIM_ACCEPT_LENGTH": "1.5"}, gate)
    assert res.returncode == 1 and f"below the previous release's {first['output_tok_s']:.1f}" in rep["error"], \
        res.stdout[-3000:]
    res, rep = deploy_bench(sandbox, "t5", {**knobs, "SGLANG_SIM_ACCEPT_LENGTH": "3.0"}, gate)  # 16 steps, not 15
    assert res.returncode == 0, res.stdout[-3000:]
    assert "SGLANG_SIM_ACCEPT_LENGTH=3.0" in serving_knobs(h)
    kept = current_figures(h)
    assert kept["accept_length"] == pytest.approx(3.0)
    print(f"kept: {kept['output_tok_s']} tok/s against {first['output_tok_s']}")


def test_the_report_page_shows_the_records_and_renders_offline(sandbox, tmp_path):
    """After a measured release: the page's figures are perf.json's, it references nothing outside
    itself, and a real headless browser, with no network at all, renders it to a non-blank PNG."""
    import zlib
    from html.parser import HTMLParser
    h = sandbox.fleet["t1"]
    inv = setup(sandbox, "t1", GOOD)
    res, _ = bench(sandbox, "t1", inv, "--baseline")
    assert res.returncode == 0, res.stdout[-3000:]
    perf = json.loads(h.run("sh", "-c", "cat /var/lib/specops/releases/current/perf.json").stdout)["sglang"]
    page = tmp_path / "report.html"
    res = sandbox.inv("report", "--host", "t1", "--out", str(page), inventory=inv)
    assert res.returncode == 0, res.stdout + res.stderr

    class Read(HTMLParser):
        tok_s, tags, refs = {}, set(), []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            self.tags.add(tag)
            self.refs += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v]
            if "data-tok-s" in a:
                self.tok_s[int(a["data-concurrency"])] = float(a["data-tok-s"])
    r = Read()
    r.feed(page.read_text())
    assert r.tok_s == {lv["concurrency"]: lv["figures"]["output_tok_s"] for lv in perf["spec"]}
    assert not r.refs and not {"script", "link", "img", "iframe"} & r.tags
    shot = tmp_path / "report.png"
    run = subprocess.run(["unshare", "--net", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", "--disable-background-networking", "--disable-component-update",
                          f"--screenshot={shot}", "--window-size=1000,1600", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert shot.exists(), run.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    idat, at = b"", 8
    while at < len(data):
        n, kind = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8]
        idat += data[at + 8:at + 8 + n] if kind == b"IDAT" else b""
        at += 12 + n
    width = int.from_bytes(data[16:20], "big")
    rows = zlib.decompress(idat)
    stride = len(rows) // int.from_bytes(data[20:24], "big")
    distinct = {rows[i:i + stride] for i in range(0, len(rows), stride)}
    assert width == 1000 and len(distinct) > 50, len(distinct)  # text and charts, not a blank page
