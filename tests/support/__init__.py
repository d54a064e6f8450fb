"""What the tests use and are not tests themselves, apart from the fixtures (tests/conftest.py):

- site.py: the test run's sandbox site and hosts, and Sandbox, a test's view of them; hosts.py:
  what a test reads off a sandbox host; files.py: files on this machine (a --json report, a lock);
  reliability.py: docs/RELIABILITY.md, built from what the marked tests recorded.
- Helpers shared by test modules, each named by what it is about: sim.py (the simulator on a
  loopback port), monitoring.py, weights.py, spec_tune.py, tuning.py, inventories.py, runs.py,
  perfpage.py, perf.py (a release's perf record), wheels.py, traffic.py, router.py, releases.py (a
  host's release and what serves it), stacks.py; daytwo.py (Prometheus, Alertmanager and load for
  the day-2 fleet tests), dashboard_check.py, seedpatch.py (the seeds' patch to SGLang's real
  file), tutorial.py (docs/tutorial.md as the suite runs it), agentwire.py (the agent's frames, the
  real loader under a test's directory), textfile.py (a release as the textfile reads it).
- Data: oracle_stubs/ (import-only stand-ins for the real SGLang oracle, sandbox/real_sglang),
  router_0.3.2.log (a real router's log, read by test_router.py).

Test modules import these as `support.NAME` (pytest puts tests/ on the path)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
