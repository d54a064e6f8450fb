"""docs/RELIABILITY.md, built from the outcomes of the tests that carry a `reliability`, a
`security` or a `found` marker, and from what the tests recorded (record_bytes: the bytes a fault
test checked and lost; record_inputs: the inputs a bad-input test tried; recorded before their
asserts).  Every sentence comes from that data; nothing in it is fixed text about results: a case
found while writing the tests is a line only beside the tests that cover it, with their outcome,
and "unit test" is said of the tests that used no sandbox host.  The document has no timestamp, so
the same outcomes always give the same bytes: CI regenerates it and fails when it differs from the
committed file.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import NamedTuple

from sandbox import fleet as fleet_mod
from support.hosts import sha256_on

DOC = Path(__file__).resolve().parents[2] / "docs" / "RELIABILITY.md"

EXPECTED = {
    "second-run": ("the second run of every task (deploy, bootstrap, gpu_stack, patches, draft config)", "0 changed"),
    "ssh-cut": ("SSH connection cut mid-apply (the sshd session killed on the host)",
                "no half-written file, and a re-run converges"),
    "start-failure": ("the service fails to start after a deploy",
                      "automatic rollback; service healthy on the previous release"),
    "health-timeout": ("health times out", "rollback, with the journal tail in the report"),
    "syntax-error": ("a patched file with a syntax error", "refused before the host changes"),
    "spec-flags": ("invalid spec-decode flags", "refused before connecting, naming SGLang's rule"),
    "bad-inventory": ("malformed YAML / unknown key / wrong type / unknown host",
                      "one-line error, exit 2, no connection"),
    "concurrent": ("concurrent deploys to one host", "the second is refused, naming the lock holder"),
    "unreachable": ("one unreachable host among 5", "the others finish; the exit code is not 0; the recap names it"),
    "sigint": ("SIGINT mid-deploy", "the lock is released, and no file is half-written"),
    "host-key": ("unknown or changed host key", "refused, unless accept-new was explicitly given"),
    "secrets": ("secrets (HF_TOKEN, api key)",
                "only in the 0600 EnvironmentFile; never in the unit, a diff, a log, the recap or JSON"),
    "metachar": ("shell metacharacters in a flag value, model path or service name",
                 "quoted or refused; the test proves nothing ran"),
    "disk-full": ("disk full during a file sync (a small tmpfs over the target directory)",
                  "the old file is intact; a clear error"),
    "gpu-window": ("the GPU-window job fails, or is interrupted", "the service is restarted and verified"),
    "orphan": ("an orphan process holds GPU memory after stop", "found and killed; the memory is proven free"),
    "traversal": ("a path traversal in a patch destination", "refused at plan time"),
    "apply-fault": ("a fault at each kind of action a deploy batch holds (write, remove, enable, a package install, "
                    "a stack build, daemon-reload, restart, ...), or a package with no candidate",
                    "the previous release verified with no drift but what a preparation left, said (a pip into the "
                    "venv in place), and the server not restarted when nothing that serves was touched; never in "
                    "between"),
    "switch-cut": ("the agent killed between two renames of a switch", "status names the half-done switch; the next "
                                                                       "run that takes the lock undoes it first"),
}


# Cases found while writing the tests, each fixed: a test marked `found(key)` covers it, and the
# story is a line of the document only beside the tests that ran for it, with their outcome.
FOUND = {
    "stale-start-stamps": "The stale-code check misfired: systemd's realtime start stamps have whole-second "
                          "precision, so a file written in the same second as the restart looked newer. Start times "
                          "now come from the µs monotonic stamps.",
    "job-exit-signal": "A job killed by a signal during `gpu-window` came back as status -1: sshd sends an "
                       "exit-signal, which paramiko drops. The job now runs under a wrapper that reports 128+signal.",
    "killed-run-leftovers": "A killed test run could leave a container whose record was already gone; the sweep now "
                            "finds sandbox processes and mounts on the machine itself.",
    "site-per-run": "`inv sandbox.up` and a test run swept each other's hosts; each now has its own site.",
    "closed-pipe": "A deploy whose output pipe closed mid-apply (`inv deploy | head`) died on its next progress "
                   "line, and its unlock then read the answer of the request it broke off (\"the agent's answer is "
                   "not understood\"). A request that ends in any error now closes the agent's session, as Ctrl-C "
                   "does: the host is left as after a cut connection, and the re-run says so and converges.",
    "unit-loaded-stale": "A run cut between a unit file's rename and its daemon-reload (a closed output pipe did it, "
                         "now and then) left systemd with the unit before: the file already as wanted, every later "
                         "deploy restarted the old definition and failed its verify. A restart now reloads first a "
                         "unit whose file changed since systemd loaded it.",
    "shared-subnet": "With two test workers, the second worker's site shared a /24 with the benchmark's: the bench "
                     "smoke test's sweep removed its service address, and its hosts lost their package index. Every "
                     "site now has a /24 and a prefix of its own, and a test reads them all.",
}


class Outcome(NamedTuple):
    """One marked test's result, as tests/conftest.py collects it."""
    outcome: str                 # pytest's: passed, failed or skipped
    properties: dict             # what the test recorded: bytes_verified/bytes_lost, bad_inputs (a list),
                                 # measured (a figure its security row gives beside its result)
    sandbox: bool = True         # it used sandbox hosts (the fleet marker or fixture); False: a unit test


def _name(nodeid: str) -> str:
    file, _, test = nodeid.partition("::")
    return f"`{file.replace('tests/', '')}::{test}`"


def _result(tests: dict) -> str:
    """As "3/3 passed", or saying what the others did: "1/3 passed; 1 failed, 1 skipped"."""
    if not tests:
        return "NOT RUN"
    counts = Counter(t.outcome for t in tests.values())
    others = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()) if outcome != "passed")
    return f"{counts['passed']}/{len(tests)} passed" + (f"; {others}" if others else "")


def _names(tests: dict, sep: str, tag_units: bool) -> str:
    """The tests' names; with tag_units, a unit test's name says so."""
    return sep.join(_name(n) + (" (unit test)" if tag_units and not t.sandbox else "")
                    for n, t in sorted(tests.items()))


def _case(what: str, tests: dict) -> tuple[str, str]:
    """A row's case and tests cells.  "(unit test)" comes from the tests themselves: on the case when
    none of them used a sandbox host, on each such test when only some did, nowhere otherwise."""
    units = [t for t in tests.values() if not t.sandbox]
    if tests and len(units) == len(tests):
        return f"{what} ({'unit tests' if len(tests) > 1 else 'unit test'})", _names(tests, "<br>", False)
    return what, _names(tests, "<br>", bool(units))


def count_inputs(outcomes: dict) -> tuple[int, int, list[str]]:
    """The bad inputs the `bad-input` tests tried: (handled as their row expects, tried, the tests
    that recorded none).

    An input is what a test passes to `record_inputs` (below) as it tries it: the one
    malformed inventory an item of a parametrized test writes, or each of the values a test tries in
    turn.  It is counted once per row, however many tests of the row tried it (the seed case of
    `spec-flags` goes through the rule check and through the CLI: one input), and never per test
    item.  An input is handled when every test of its row that tried it passed.  A test that
    recorded no input counts for nothing, and is named instead."""
    handled, tried, silent = 0, 0, []
    for case, got in sorted(outcomes.items()):
        if got["kind"] != "bad-input":
            continue
        ok: dict[str, bool] = {}
        for nodeid, t in sorted(got["tests"].items()):
            inputs = t.properties.get("bad_inputs") or []
            if not inputs:
                silent.append(_name(nodeid))
            for value in inputs:
                ok[value] = ok.get(value, True) and t.outcome == "passed"
        handled += sum(ok.values())
        tried += len(ok)
    return handled, tried, silent


def render_found(found: dict) -> list[str]:
    """found: key of FOUND → {nodeid: Outcome}, from the tests marked `found(key)`.  A story is a
    line only with the tests that ran for it, and their result; with none, nothing is written."""
    lines = [f"- {story} {'Tests' if len(found[key]) > 1 else 'Test'}: {_names(found[key], ', ', True)}: "
             f"{_result(found[key])}."
             for key, story in FOUND.items() if found.get(key)]
    if not lines:
        return []
    return ["## Other cases found while writing these tests", "",
            "Each was fixed; after it, the tests that cover it, with their result in the last full run.", "",
            *lines, ""]


def render(outcomes: dict, security: dict, found: dict | None = None) -> str:
    """outcomes: case → {kind, tests: {nodeid: Outcome}}; security: case → {attack, tests: {nodeid:
    Outcome}}; found: key of FOUND → {nodeid: Outcome} (render_found)."""
    rows, faults, fault_tests = [], 0, []
    for case, (what, expected) in EXPECTED.items():
        got = outcomes.get(case, {"kind": "?", "tests": {}})
        tests = got["tests"]
        what, names = _case(what, tests)
        rows.append(f"| {what} | {expected} | {names} | {_result(tests)} |")
        if got["kind"] == "fault":
            faults += sum(1 for t in tests.values() if t.outcome == "passed")
            fault_tests += [(n, t.properties) for n, t in sorted(tests.items())]
    handled, tried, silent = count_inputs(outcomes)
    measured = [p for _, p in fault_tests if "bytes_verified" in p]
    unmeasured = sorted({_name(n) for n, p in fault_tests if "bytes_verified" not in p})
    verified = sum(p["bytes_verified"] for p in measured)
    lost = sum(p.get("bytes_lost", 0) for p in measured)
    sec_rows = []
    for case, entry in sorted(security.items()):
        attack, names = _case(entry["attack"], entry["tests"])
        figures = "".join(f"; {t.properties['measured']}" for _, t in sorted(entry["tests"].items())
                          if t.properties.get("measured"))
        sec_rows.append(f"| {case} | {attack} | {names} | {_result(entry['tests'])}{figures} |")
    doc = ["# Reliability", "",
           "Each row is a test on sandbox hosts (unless it says unit test) in `tests/`, with its result in the",
           "last full run. The test session writes this file (`SPECOPS_WRITE_RELIABILITY=1 bash scripts/test.sh`);",
           "CI regenerates it and fails if it differs from this one.", "",
           "| case | expected | tests | result |", "|---|---|---|---|", *rows, "",
           f"- faults injected and survived: {faults} (of {len(fault_tests)} fault tests run)",
           f"- bad inputs handled as their row expects: {handled} of the {tried} distinct inputs tried"
           + (f"; recorded no input, so not counted: {', '.join(silent)}" if silent else ""),
           f"- bytes lost: {lost}, of {verified} bytes that {len(measured)} fault tests compared by sha256 before "
           f"and after their fault"
           + (f"; not compared byte for byte: {', '.join(unmeasured)}" if unmeasured else ""), "",
           "## Security", "",
           "What a local user of a shared GPU box could try, tried for real on a sandbox host.", "",
           "| case | attack tried | tests | result |", "|---|---|---|---|", *sec_rows, "",
           *render_found(found or {})]
    return "\n".join(doc)


def record_inputs(record_property, *inputs) -> None:
    """A bad-input test's inputs, recorded as it tries them (before its asserts): docs/RELIABILITY.md
    counts these, each once per row (count_inputs, above), not test items.  One call
    with several inputs, or one call per input."""
    record_property("bad_inputs", [str(i) for i in inputs])


def record_bytes(record_property, h: fleet_mod.Host, expected: dict[str, str]) -> dict[str, str]:
    """A fault test's byte-for-byte check, recorded before its asserts: `expected` maps paths to
    the sha256 they must still have.  Returns what the host has now."""
    now = sha256_on(h, *expected)
    sizes = {p: int(h.run("stat", "-c", "%s", p).stdout) for p in expected}
    record_property("bytes_verified", sum(sizes.values()))
    record_property("bytes_lost", sum(sizes[p] for p in expected if now[p] != expected[p]))
    return now
