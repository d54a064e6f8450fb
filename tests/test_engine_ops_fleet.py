"""The engine's ops against a real host (real SSH, real files, real systemd): every kind of op
changes, then reports zero; --check prints the diff and changes nothing; and a unit that
systemd-analyze verify refuses (a broken one, a warning alone; also with a systemd older than 250)
refuses the whole batch before anything is placed."""
import json

import pytest

from specops.ops import Absent, Command, Directory, File, JsonKeys, Service, template, unit_file
from support.hosts import sha256_on, unit_prop
from support.site import role

pytestmark = pytest.mark.fleet

UNIT = """[Unit]
Description=specops test unit {tag}

[Service]
Type=simple
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""


def every_op(tag: str):
    def make(host):
        return [
            Directory("/srv/demo", mode="0750"),
            File("/srv/demo/plain.txt", f"hello {tag}\n", mode="0640", owner="root", group="daemon"),
            template("/srv/demo/sglang.env", "sglang.env.j2", {"name": "demo", "secrets": []}, mode="0600"),
            Absent("/srv/demo/old.txt"),
            JsonKeys("/srv/demo/config.json", {"eagle_config.eagle_aux_hidden_state_layer_ids": [2, 16, 29],
                                                "tag": tag}),
            unit_file("demo-sleep", UNIT.format(tag=tag)),
            Service("demo-sleep", enabled=True),
            Command(["sh", "-c", f"echo {tag} > /srv/demo/marker"], desc="write marker",
                    unless=f"grep -qx {tag} /srv/demo/marker"),
        ]
    return role("demo", make)


def fresh_demo_host(sandbox, name):
    h = sandbox.reset(name)
    h.run("mkdir", "-p", "/srv/demo")
    h.path("/srv/demo/config.json").write_text('{"architectures": ["X"]}')
    h.path("/srv/demo/old.txt").write_text("x\n")
    return h, sandbox.inventory({name: {}})


def test_every_op_changes_then_reports_zero(sandbox):
    h, inv = fresh_demo_host(sandbox, "t1")

    first, out = sandbox.apply(inv, [every_op("a")])
    assert first[0].error is None, out
    assert first[0].changed == 8, out
    assert h.path("/srv/demo/plain.txt").read_text() == "hello a\n"
    assert h.run("stat", "-c", "%a %U %G", "/srv/demo/plain.txt").stdout.split() == ["640", "root", "daemon"]
    assert h.run("stat", "-c", "%a", "/srv/demo").stdout.strip() == "750"
    assert not h.path("/srv/demo/old.txt").exists()
    cfg = json.loads(h.path("/srv/demo/config.json").read_text())
    assert cfg == {"architectures": ["X"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]},
                   "tag": "a"}
    assert unit_prop(h, "demo-sleep", "ActiveState") == "active"
    assert unit_prop(h, "demo-sleep", "UnitFileState") == "enabled"
    assert h.path("/srv/demo/marker").read_text() == "a\n"
    # No staging leftovers anywhere we wrote.
    assert not list(h.path("/srv/demo").glob(".specops-stage*"))

    demo = ["/srv/demo/plain.txt", "/srv/demo/sglang.env", "/srv/demo/config.json", "/srv/demo/marker",
            "/etc/systemd/system/demo-sleep.service"]
    before = sha256_on(h, *demo), unit_prop(h, "demo-sleep", "ExecMainStartTimestampMonotonic")
    second, out = sandbox.apply(inv, [every_op("a")])
    assert second[0].error is None and second[0].changed == 0, out
    assert second[0].round_trips == 2  # the probe (taking the lock) and giving the lock back
    assert (sha256_on(h, *demo), unit_prop(h, "demo-sleep", "ExecMainStartTimestampMonotonic")) == before


def test_check_mode_prints_diff_and_changes_nothing(sandbox):
    h, inv = fresh_demo_host(sandbox, "t2")
    first, out = sandbox.apply(inv, [every_op("before")])
    assert first[0].error is None, out
    paths = ["/srv/demo/plain.txt", "/srv/demo/config.json", "/etc/systemd/system/demo-sleep.service",
             "/srv/demo/marker"]
    before = sha256_on(h, *paths)
    started = unit_prop(h, "demo-sleep", "ExecMainStartTimestampMonotonic")

    reports, out = sandbox.apply(inv, [every_op("after")], check=True)
    assert reports[0].error is None, out
    assert reports[0].changed == 4, out  # file, json key, unit, marker command
    assert "-hello before\n+hello after" in out
    assert "-Description=specops test unit before" in out and "+Description=specops test unit after" in out
    assert '-  "tag": "before"' in out and '+  "tag": "after"' in out
    assert "would change" in out and "handler         restart demo-sleep: would be notified" in out
    assert sha256_on(h, *paths) == before
    assert unit_prop(h, "demo-sleep", "ExecMainStartTimestampMonotonic") == started


def test_validator_failure_refuses_whole_batch(sandbox):
    h = sandbox.reset("t4")
    inv = sandbox.inventory({"t4": {}})
    ops = lambda host: [File("/srv/a.txt", "a\n"), unit_file("broken", "[Service]\nExecStart=relative/path\n")]
    reports, out = sandbox.apply(inv, [role("w", ops)])
    assert reports[0].error and "systemd-analyze verify refused /etc/systemd/system/broken.service" in reports[0].error
    assert not h.path("/srv/a.txt").exists()  # validated before anything was placed
    assert not h.path("/etc/systemd/system/broken.service").exists()


def test_a_warning_in_the_unit_refuses_it(sandbox):
    """systemd-analyze verify of the unit alone fails on its warnings: a misspelt key, which
    systemd would ignore at run time, is refused (plain verify exits 0 on it)."""
    h = sandbox.reset("t4")
    inv = sandbox.inventory({"t4": {}})
    typo = UNIT.format(tag="typo").replace("Type=simple", "Typ=simple")
    reports, out = sandbox.apply(inv, [role("w", lambda host: [unit_file("typo", typo)])])
    assert reports[0].error and "Unknown key 'Typ' in section [Service]" in reports[0].error, out
    assert not h.path("/etc/systemd/system/typo.service").exists()


def test_an_older_systemd_analyze_still_verifies(sandbox):
    """systemd before 250 has no --recursive-errors: verify runs without it, and still refuses."""
    h = sandbox.reset("t4")
    real = h.run("sh", "-c", "command -v systemd-analyze").stdout.strip()
    # As systemd 249's getopt answers an option it does not know.
    h.path("/usr/local/bin/systemd-analyze").write_text(
        "#!/bin/sh\necho \"$*\" >> /run/analyze.log\nfor a; do case $a in --recursive-errors=*) echo "
        f"\"systemd-analyze: unrecognized option '$a'\" >&2; exit 1;; esac; done\nexec {real} \"$@\"\n")
    h.run("chmod", "755", "/usr/local/bin/systemd-analyze")
    inv = sandbox.inventory({"t4": {}})
    ok = lambda host: [unit_file("demo-sleep", UNIT.format(tag="old"))]
    reports, out = sandbox.apply(inv, [role("w", ok)])
    assert reports[0].error is None, out
    assert h.path("/etc/systemd/system/demo-sleep.service").exists()
    asked = h.run("cat", "/run/analyze.log").stdout.splitlines()  # refused the option, then verified without
    assert len(asked) == 2 and "--recursive-errors=no" in asked[0] and "--recursive" not in asked[1], asked
    broken = lambda host: [unit_file("broken", "[Service]\nExecStart=relative/path\n")]
    reports, out = sandbox.apply(inv, [role("w", broken)])
    assert reports[0].error and "systemd-analyze verify refused" in reports[0].error, out
    h.run("rm", "/usr/local/bin/systemd-analyze")
