"""docs/RELIABILITY.md, built from the outcomes of the tests that carry a `reliability` or a
`security` marker, and from what the fault tests measured (bytes checked and lost, recorded
before their asserts).  Every sentence comes from that data; nothing in it is fixed text about
results.  The document has no timestamp, so the same outcomes always give the same bytes: CI
regenerates it and fails when it differs from the committed file.
"""
from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "RELIABILITY.md"

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



def _name(nodeid: str) -> str:
    file, _, test = nodeid.partition("::")
    return f"`{file.replace('tests/', '')}::{test}`"


def _result(tests: dict) -> str:
    passed = sum(1 for o, _ in tests.values() if o == "passed")
    return f"{passed}/{len(tests)} passed" if tests else "NOT RUN"


def render(outcomes: dict, security: dict) -> str:
    """outcomes: case → {kind, tests: {nodeid: (outcome, properties)}};
    security: case → {attack, tests: {nodeid: (outcome, properties)}}."""
    rows, faults, fault_tests, bad = [], 0, [], 0
    for case, (what, expected) in EXPECTED.items():
        got = outcomes.get(case, {"kind": "?", "tests": {}})
        tests = got["tests"]
        names = "<br>".join(_name(n) for n in sorted(tests))
        rows.append(f"| {what} | {expected} | {names} | {_result(tests)} |")
        passed = sum(1 for o, _ in tests.values() if o == "passed")
        if got["kind"] == "fault":
            faults += passed
            fault_tests += [(n, o, p) for n, (o, p) in sorted(tests.items())]
        elif got["kind"] == "bad-input":
            bad += passed
    measured = [(n, p) for n, o, p in fault_tests if "bytes_verified" in p]
    unmeasured = sorted({_name(n) for n, o, p in fault_tests if "bytes_verified" not in p})
    verified = sum(p["bytes_verified"] for _, p in measured)
    lost = sum(p.get("bytes_lost", 0) for _, p in measured)
    sec_rows = [f"| {case} | {entry['attack']} | {'<br>'.join(_name(n) for n in sorted(entry['tests']))} | "
                f"{_result(entry['tests'])} |" for case, entry in sorted(security.items())]
    doc = ["# Reliability", "",
           "Each row is a test on sandbox hosts (unless it says unit test) in `tests/`, with its result in the",
           "last full run. The test session writes this file (`SPECOPS_WRITE_RELIABILITY=1 bash scripts/test.sh`);",
           "CI regenerates it and fails if it differs from this one.", "",
           "| case | expected | tests | result |", "|---|---|---|---|", *rows, "",
           f"- faults injected and survived: {faults} (of {len(fault_tests)} fault tests run)",
           f"- bad inputs tried and rejected cleanly: {bad}",
           f"- bytes lost: {lost}, of {verified} bytes that {len(measured)} fault tests compared by sha256 before "
           f"and after their fault"
           + (f"; not compared byte for byte: {', '.join(unmeasured)}" if unmeasured else ""), "",
           "## Security", "",
           "What a local user of a shared GPU box could try, tried for real on a sandbox host.", "",
           "| case | attack tried | tests | result |", "|---|---|---|---|", *sec_rows, "",
           *FOUND, ""]
    return "\n".join(doc)
