"""The benchmark keeps working: one host, one run of each tool (speed is measured in bench/ only)."""
import json
import subprocess
import sys

import pytest
from support import ROOT


pytestmark = [pytest.mark.fleet, pytest.mark.slow]


def test_bench_smoke(tmp_path):
    res = subprocess.run([sys.executable, "bench/run.py", "--hosts", "1", "--runs", "1", "--smoke"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    results = json.loads(res.stdout)["1"]
    assert set(results) == {"specops", "ansible", "pyinfra"}
    assert all(results[t]["first"] > 0 and results[t]["noop"] > 0 for t in results)
    # One agent session per host and run: one SSH channel, counted at paramiko's Transport, carries
    # the probe (with the lock) and verify on a no-op, and probe, apply, verify, release on a first run.
    assert results["specops"]["channels_noop"] == 1
    assert results["specops"]["channels_first"] == 1

