"""Shared fixtures: one sandbox fleet per session, inventories written per test."""
from __future__ import annotations

import json
import os
import subprocess
import time
import sys
import types
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox import fleet as fleet_mod, provision  # noqa: E402
from specops.run import Options, Redactor, Reporter, run_hosts  # noqa: E402
from specops import inventory as inventory_mod  # noqa: E402

FLEET_HOSTS = ["t1", "t2", "t3", "t4", "t5"]
# Apart from `inv sandbox.up`'s site, so a user's sandbox and a test run never sweep each other.
TEST_SITE = fleet_mod.Site("sot", "192.168.235", Path("/var/lib/specops-test"))


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="fleet tests need root (network namespaces, nspawn)")
        for item in items:
            if "fleet" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def fleet():
    """Five booted sandbox hosts with SGLang (simulator) preinstalled, reused by every test."""
    f = fleet_mod.Fleet(FLEET_HOSTS, layers=[provision.layer("gpubox")], site=TEST_SITE).up()
    provision.write_known_hosts(f)
    yield f
    f.down()


@pytest.fixture(scope="session")
def pkg_index(fleet):
    """The sandbox package index (stand-in CUDA torch, the SGLang simulator, real CPU torch
    and fla), served to the fleet."""
    from sandbox import pkgindex
    index = pkgindex.Index(fleet.site).start()
    yield index
    index.stop()


class Sandbox:
    """Per-test view of the fleet: inventories, host resets and specops runs."""

    def __init__(self, fleet: fleet_mod.Fleet, tmp: Path):
        self.fleet, self.tmp = fleet, tmp

    def host(self, name: str) -> fleet_mod.Host:
        return self.fleet[name]

    def reset(self, name: str, layers=None) -> fleet_mod.Host:
        h = self.fleet.reset(name, layers)
        provision.write_known_hosts(self.fleet)  # a reset host has a new host key
        return h

    def inventory(self, hosts: dict[str, dict], group_vars: dict | None = None) -> Path:
        """Write an inventory for these fleet hosts: {name: extra vars}."""
        entries = {}
        for name, extra in hosts.items():
            h = self.fleet[name] if name in FLEET_HOSTS else None
            base = provision.host_vars(h) if h else {}
            entries[name] = {**base, **extra}
        doc = {"all": {"vars": {"venv": provision.VENV, **(group_vars or {})},
                       "children": {"fleet": {"hosts": entries}}}}
        path = self.tmp / "inventory"
        path.mkdir(exist_ok=True)
        (path / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def inv(self, *args: str, inventory: Path | None = None, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run the real CLI, as a user would."""
        cmd = [sys.executable, "-m", "invoke", *args]
        full_env = {**os.environ, **(env or {})}
        if inventory:
            full_env["SPECOPS_INVENTORY"] = str(inventory)
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=full_env, stdin=subprocess.DEVNULL)

    def interrupt(self, *args: str, inventory: Path, when: str, before=None) -> tuple[int, str]:
        """Run the CLI, send it SIGINT (Ctrl-C) when a line contains `when` (after calling
        `before`, if given, while it still runs); returns (exit status, output)."""
        import signal
        proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "SPECOPS_INVENTORY": str(inventory)})
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if when in line:
                if before:
                    before()
                proc.send_signal(signal.SIGINT)
                break
        out = "".join(seen) + proc.communicate(timeout=120)[0]
        return proc.returncode, out

    def apply(self, inventory: Path, roles: list, check: bool = False, host: str | None = None,
              body=None, **opt):
        """Run roles in-process through the engine; returns (reports, printed output)."""
        import io
        hosts = inventory_mod.load(inventory).select(host, None)
        buf = io.StringIO()
        out = Reporter(Redactor(hosts), show_diff=True, stream=buf)
        reports = run_hosts(hosts, body or (lambda run: run.converge()), roles,
                            Options(check=check, **opt), out)
        return reports, buf.getvalue()


@pytest.fixture
def sandbox(fleet, tmp_path):
    return Sandbox(fleet, tmp_path)


def role(name: str, make_ops, reprobe: bool = False):
    """An ad-hoc role for engine tests: make_ops(host) -> list[Op]."""
    return types.SimpleNamespace(NAME=name, ops=make_ops, REPROBE=reprobe)


def sha256_on(h: fleet_mod.Host, *paths: str) -> dict:
    out = h.run("sha256sum", *paths, check=False).stdout
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def unit_prop(h: fleet_mod.Host, unit: str, prop: str) -> str:
    return h.run("systemctl", "show", unit, "-p", prop, "--value").stdout.strip()


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# ---- docs/RELIABILITY.md, from the outcomes of the tests that carry a reliability marker ----

EXPECTED = {
    "second-run": ("the second run of every task (deploy, bootstrap, gpu_stack, patches, draft config)", "0 changed"),
    "ssh-cut": ("SSH connection cut mid-apply (the sshd session killed on the host)", "no half-written file, and a re-run converges"),
    "start-failure": ("the service fails to start after a deploy", "automatic rollback; service healthy on the previous release"),
    "health-timeout": ("health times out", "rollback, with the journal tail in the report"),
    "syntax-error": ("a patched file with a syntax error", "refused before the host changes"),
    "spec-flags": ("invalid spec-decode flags", "refused before connecting, naming SGLang's rule"),
    "bad-inventory": ("malformed YAML / unknown key / wrong type / unknown host (unit test)", "one-line error, exit 2, no connection"),
    "concurrent": ("concurrent deploys to one host", "the second is refused, naming the lock holder"),
    "unreachable": ("one unreachable host among 5", "the others finish; the exit code is not 0; the recap names it"),
    "sigint": ("SIGINT mid-deploy", "the lock is released, and no file is half-written"),
    "host-key": ("unknown or changed host key", "refused, unless accept-new was explicitly given"),
    "secrets": ("secrets (HF_TOKEN, api key)", "only in the 0600 EnvironmentFile; never in the unit, a diff, a log, the recap or JSON"),
    "metachar": ("shell metacharacters in a flag value, model path or service name", "quoted or refused; the test proves nothing ran"),
    "disk-full": ("disk full during a file sync (a small tmpfs over the target directory)", "the old file is intact; a clear error"),
    "gpu-window": ("the GPU-window job fails, or is interrupted", "the service is restarted and verified"),
    "orphan": ("an orphan process holds GPU memory after stop", "found and killed; the memory is proven free"),
    "traversal": ("a path traversal in a patch destination", "refused at plan time"),
}
FOUND = [
    "## Other cases found while writing these tests (each fixed, each covered by a test)", "",
    "- The stale-code check misfired: systemd's realtime start stamps have whole-second precision, so a file "
    "written in the same second as the restart looked newer. Start times now come from the µs monotonic "
    "stamps (`test_second_deploy_changes_nothing_and_does_not_restart`, `test_stale_process_is_reported_and_restarted`).",
    "- A job killed by a signal during `gpu-window` came back as status -1: sshd sends an exit-signal, which "
    "paramiko drops. The job now runs under a wrapper that reports 128+signal (`test_gpu_window_failing_job_then_ctrl_c`).",
    "- A killed test run could leave a container whose record was already gone; the sweep now finds sandbox "
    "processes and mounts on the machine itself (`test_killed_run_leftovers_are_swept_and_teardown_is_clean`).",
    "- `inv sandbox.up` and a test run swept each other's hosts; each now has its own site.",
    "- A deploy killed by a closed output pipe (`inv deploy | head`) mid-apply converged on the re-run, like "
    "the cut connection above.",
]
_outcomes: dict = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "reliability(case, kind): a row of docs/RELIABILITY.md")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    for mark in item.iter_markers("reliability"):
        if report.when == "call" or report.outcome != "passed":
            case, kind = mark.args
            _outcomes.setdefault(case, {"kind": kind, "tests": {}})["tests"][item.nodeid] = (
                report.outcome, dict(report.user_properties))


def pytest_sessionfinish(session, exitstatus):
    if not os.environ.get("SPECOPS_WRITE_RELIABILITY") or not _outcomes:
        return
    rows, faults, bad, verified, lost = [], 0, 0, 0, 0
    for case, (what, expected) in EXPECTED.items():
        got = _outcomes.get(case, {"kind": "?", "tests": {}})
        tests = got["tests"]
        passed = sum(1 for o, _ in tests.values() if o == "passed")
        result = f"{passed}/{len(tests)} passed" if tests else "NOT RUN"
        names = "<br>".join(f"`{n.split('::', 1)[0].replace('tests/', '')}::{n.split('::', 1)[1]}`"
                            for n in sorted(tests))
        rows.append(f"| {what} | {expected} | {names} | {result} |")
        if got["kind"] == "fault":
            faults += passed
        elif got["kind"] == "bad-input":
            bad += passed
        for o, props in tests.values():
            verified += props.get("bytes_verified", 0)
            lost += props.get("bytes_lost", 0)
    doc = ["# Reliability", "",
           "Each row is a test on sandbox hosts (unless it says unit test) in `tests/`. The results are from",
           f"the last full run ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}), written by the test "
           "session itself: `SPECOPS_WRITE_RELIABILITY=1 bash scripts/test.sh`.", "",
           "| case | expected | tests | result |", "|---|---|---|---|", *rows, "",
           f"- faults injected and survived: {faults}",
           f"- bad inputs tried and rejected cleanly: {bad}",
           f"- bytes lost: {lost} (files checked byte for byte after faults: every fault test compares "
           f"sha256 before and after; the disk-full test alone verified {verified} bytes)", "",
           *FOUND, ""]
    (ROOT / "docs" / "RELIABILITY.md").write_text("\n".join(doc))
