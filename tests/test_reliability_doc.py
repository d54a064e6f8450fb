"""docs/RELIABILITY.md's renderer (tests/support/reliability.py), on made-up outcomes: no fleet."""
from support.reliability import FOUND, Outcome, count_inputs, render

PASS, FAIL = "passed", "failed"


def bad_input(*tests):
    """A bad-input row: tests are (nodeid, outcome, inputs, sandbox)."""
    return {"kind": "bad-input", "tests": {n: Outcome(o, {"bad_inputs": list(i)} if i is not None else {}, s)
                                           for n, o, i, s in tests}}


def line(doc: str, start: str) -> str:
    return next(l for l in doc.splitlines() if l.startswith(start))


def row(doc: str, text: str) -> str:
    return next(l for l in doc.splitlines() if l.startswith("|") and text in l)


def test_bad_inputs_are_counted_per_input_not_per_test_item():
    outcomes = {
        # a parametrized test: one input per item
        "traversal": bad_input(("tests/test_patches.py::t[a]", PASS, ["../x"], False),
                               ("tests/test_patches.py::t[b]", PASS, ["/etc/passwd"], False)),
        # one test trying three values in turn
        "metachar": bad_input(("tests/test_reliability_fleet.py::t", PASS, ["name;x", "$(x)", "`x`"], True)),
        # one input tried two ways (the rule check, the CLI): one input
        "spec-flags": bad_input(("tests/test_rules.py::a", PASS, ["topk 1, 16 drafts"], False),
                                ("tests/test_rules.py::b", PASS, ["topk 1, 16 drafts"], False)),
    }
    doc = render(outcomes, {})
    assert count_inputs(outcomes) == (6, 6, [])
    assert line(doc, "- bad inputs") == "- bad inputs handled as their row expects: 6 of the 6 distinct inputs tried"


def test_an_input_of_a_failed_test_is_tried_not_handled_and_a_test_without_inputs_is_named():
    outcomes = {"traversal": bad_input(("tests/test_patches.py::t[a]", PASS, ["../x"], False),
                                       ("tests/test_patches.py::t[b]", FAIL, ["/etc/passwd"], False),
                                       ("tests/test_patches.py::t[c]", PASS, None, False)),
                "spec-flags": bad_input(("tests/test_rules.py::a", PASS, ["seed"], False),
                                        ("tests/test_rules.py::b", FAIL, ["seed"], False))}
    assert count_inputs(outcomes) == (1, 3, ["`test_patches.py::t[c]`"])
    assert line(render(outcomes, {}), "- bad inputs") == (
        "- bad inputs handled as their row expects: 1 of the 3 distinct inputs tried; recorded no input, "
        "so not counted: `test_patches.py::t[c]`")


def test_a_failed_test_shows_as_failed():
    outcomes = {"health-timeout": {"kind": "fault", "tests": {
        "tests/test_reliability_fleet.py::a": Outcome(PASS, {}),
        "tests/test_reliability_fleet.py::b": Outcome(FAIL, {}),
        "tests/test_reliability_fleet.py::c": Outcome("skipped", {})}}}
    security = {"lock-lease": {"attack": "an old lease",
                               "tests": {"tests/test_hardening_fleet.py::t": Outcome(FAIL, {})}}}
    found = {"site-per-run": {"tests/test_fleet.py::t": Outcome(FAIL, {})}}
    doc = render(outcomes, security, found)
    assert row(doc, "health times out").endswith("| 1/3 passed; 1 failed, 1 skipped |")
    assert row(doc, "lock-lease").endswith("| 0/1 passed; 1 failed |")
    assert line(doc, f"- {FOUND['site-per-run']}") == (f"- {FOUND['site-per-run']} Test: `test_fleet.py::t`: "
                                                       "0/1 passed; 1 failed.")
    assert row(doc, "SIGINT mid-deploy").endswith("| NOT RUN |")


def test_a_found_case_is_a_line_only_with_the_tests_that_ran_for_it():
    found = {"killed-run-leftovers": {"tests/test_fleet.py::killed": Outcome(PASS, {}),
                                      "tests/test_x.py::unit": Outcome(PASS, {}, sandbox=False)},
             "site-per-run": {}}
    doc = render({}, {}, found)
    lines = [l for l in doc.partition("## Other cases found")[2].splitlines() if l.startswith("- ")]
    assert lines == [f"- {FOUND['killed-run-leftovers']} Tests: `test_fleet.py::killed`, "
                     "`test_x.py::unit` (unit test): 2/2 passed."]
    assert doc.count("## Other cases found") == 1
    for nothing in ({}, {"site-per-run": {}}):  # no test ran for any story: no section, no story
        empty = render({}, {}, nothing)
        assert "## Other cases found" not in empty and not any(story in empty for story in FOUND.values())
        assert empty.endswith("|\n")


def test_unit_test_is_said_from_the_tests_not_from_fixed_text():
    outcomes = {"bad-inventory": bad_input(("tests/test_inventory.py::a", PASS, ["yaml"], False),
                                           ("tests/test_inventory.py::b", PASS, ["key"], False)),
                "traversal": bad_input(("tests/test_patches.py::t", PASS, ["../x"], False)),
                "spec-flags": bad_input(("tests/test_rules.py::unit", PASS, ["seed"], False),
                                        ("tests/test_rules_fleet.py::fleet", PASS, ["seed"], True)),
                "host-key": bad_input(("tests/test_engine_fleet.py::t", PASS, ["unknown key"], True))}
    doc = render(outcomes, {})
    assert row(doc, "malformed YAML").startswith("| malformed YAML / unknown key / wrong type / unknown host "
                                                 "(unit tests) |")
    assert row(doc, "path traversal").startswith("| a path traversal in a patch destination (unit test) |")
    # mixed: the unit test is named as one, the row is not
    assert row(doc, "spec-decode") == ("| invalid spec-decode flags | refused before connecting, naming SGLang's "
                                       "rule | `test_rules.py::unit` (unit test)<br>`test_rules_fleet.py::fleet` | "
                                       "2/2 passed |")
    assert "unit test" not in row(doc, "host key")
    assert "unit test" not in row(doc, "disk full")  # not run: no tests to say it of


def test_a_security_row_gives_what_its_test_measured_and_the_fault_tests_stay_counted():
    outcomes = {"disk-full": {"kind": "fault", "tests": {
        "tests/test_reliability_fleet.py::d": Outcome(PASS, {"bytes_verified": 100, "bytes_lost": 0})}}}
    security = {
        "hardened-unit": {"attack": "systemd-analyze", "tests": {
            "tests/test_unit_hardening_fleet.py::t": Outcome(PASS, {"measured": "9.6 without, 4.2 with"})}},
        "agent-cache": {"attack": "a cached zip", "tests": {"tests/test_hardening_fleet.py::c": Outcome(PASS, {})}}}
    doc = render(outcomes, security)
    assert row(doc, "hardened-unit").endswith("| 1/1 passed; 9.6 without, 4.2 with |")
    assert row(doc, "agent-cache").endswith("| 1/1 passed |")
    assert line(doc, "- bytes lost").startswith("- bytes lost: 0, of 100 bytes that 1 fault tests compared")
