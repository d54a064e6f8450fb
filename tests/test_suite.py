"""The suite's own wiring, where a slip would quietly drop fleet coverage.  No fleet."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_logins_runs_the_default_logins_and_a_test_that_names_its_own_gets_them():
    """`@pytest.mark.logins` is root and password sudo; the bare bootstrap names NOPASSWD sudo too
    (a cloud image's).  With the marker's arguments ignored, the bootstrap's NOPASSWD run would
    vanish and every test would stay green (review of issue 24)."""
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/test_lifecycle_fleet.py"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    ids = [line.split("::", 1)[1] for line in res.stdout.splitlines() if "::" in line]
    assert [i for i in ids if i.startswith("test_bootstrap_takes_a_bare_host")] == [
        f"test_bootstrap_takes_a_bare_host_to_verified_serving[{login}]"
        for login in ("root", "ubuntu-sudo", "ubuntu-sudo-pass")], res.stdout + res.stderr
    assert [i for i in ids if i.startswith("test_two_rollbacks")] == [
        f"test_two_rollbacks_restore_n_minus_1_then_n_minus_2[{login}]" for login in ("root", "ubuntu-sudo-pass")]


@pytest.mark.found("shared-subnet")
def test_every_sandbox_site_has_a_subnet_and_a_prefix_of_its_own():
    """Sites run side by side (two test workers, the benchmarks, tests that make their own): one
    that shares another's /24 takes over its addresses and, swept, removes its service address
    (found: the second test worker's site on the benchmark's /24 cut its hosts off their package
    index)."""
    import re
    sites = []
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("sandbox/*.py")]:
        sites += re.findall(r'Site\("(\w+)", "(192\.168\.\d+)"', path.read_text())
    sites.append(("sop", "192.168.231"))  # sandbox/fleet.py's default: `inv sandbox.up`
    prefixes, subnets = [p for p, _ in sites], [s for _, s in sites]
    assert len(sites) >= 10 and len(set(subnets)) == len(subnets), sorted(sites)
    assert not [(a, b) for a in prefixes for b in prefixes if a != b and b.startswith(a)], prefixes
