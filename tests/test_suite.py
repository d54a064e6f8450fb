"""The suite's own wiring, where a slip would quietly drop fleet coverage.  No fleet."""
import subprocess
import sys
from pathlib import Path

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
