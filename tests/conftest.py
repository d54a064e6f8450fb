"""Shared fixtures: one sandbox fleet per session, inventories written per test, and the hooks
that write docs/RELIABILITY.md.  What the fixtures hand out, and the tests' other helpers, are
tests/support/'s."""
from __future__ import annotations

import fcntl
import os
import tempfile
import shutil
import signal
import sys

import pytest

from support import ROOT

sys.path.insert(0, str(ROOT))
# A suite started with SIGINT ignored (a background job of a non-interactive shell, nohup, some CI
# runners) would pass that on to every process a test interrupts, and Python then never raises
# KeyboardInterrupt there: each process of the suite takes Ctrl-C as Python does by default, and
# its children (exec resets a handled signal) start with SIGINT's default.
signal.signal(signal.SIGINT, signal.default_int_handler)

from sandbox import fleet as fleet_mod, provision  # noqa: E402
from support.site import FLEET_HOSTS, TEST_SITE, Sandbox  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Without root the fleet cannot run.  That fails the run (CI must not pass on unit tests
    alone), unless SPECOPS_SKIP_FLEET=1 asks explicitly for the unit tests only."""
    from support.reliability import FOUND
    for item in items:
        for mark in item.iter_markers("found"):
            if mark.args[0] not in FOUND:
                raise pytest.UsageError(f"{item.nodeid}: found({mark.args[0]!r}): "
                                        "no such story in tests/support/reliability.py")
    items.sort(key=_weight)
    fleet_items = [item for item in items if "fleet" in item.keywords]
    if os.geteuid() == 0 or not fleet_items:
        return
    if not os.environ.get("SPECOPS_SKIP_FLEET"):
        pytest.exit(f"{len(fleet_items)} fleet tests need root (network namespaces, systemd-nspawn); run as "
                    "root, or set SPECOPS_SKIP_FLEET=1 to run the unit tests alone", returncode=3)
    skip = pytest.mark.skip(reason="SPECOPS_SKIP_FLEET=1: fleet tests need root")
    for item in fleet_items:
        item.add_marker(skip)


# The files that take longest (each some minutes on CI), run first: two workers take
# whole files in this order (scripts/test.sh: --dist loadfile --no-loadscope-reorder), so that
# neither starts a long file while the other is nearly done.  Then the other fleet files, then the
# unit tests, which fill the gaps at the end.
LONGEST = ["test_router_fleet.py", "test_router_status_fleet.py", "test_leftovers_fleet.py", "test_monitoring_fleet.py",
           "test_traffic_fleet.py", "test_lifecycle_fleet.py", "test_specbench_fleet.py", "test_weights_fleet.py",
           "test_upgrade_fleet.py", "test_upgrade_single_venv_fleet.py"]


def _weight(item) -> tuple:
    name = item.path.name
    return (LONGEST.index(name) if name in LONGEST else len(LONGEST), "fleet" not in item.keywords)


@pytest.fixture(scope="session")
def fleet():
    """Five booted sandbox hosts with SGLang (simulator) preinstalled, reused by every test.
    One test run at a time: a second would reset and restart the first one's hosts under it."""
    TEST_SITE.state.mkdir(parents=True, exist_ok=True)
    lock = open(TEST_SITE.state / "run.lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"[sandbox] another test run holds {TEST_SITE.state}; waiting for it", file=sys.stderr, flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
    f = fleet_mod.Fleet(FLEET_HOSTS, layers=[provision.layer("gpubox")], site=TEST_SITE).up()
    provision.write_known_hosts(f)
    yield f
    f.down()
    lock.close()


@pytest.fixture(scope="session")
def pkg_index(fleet):
    """The sandbox package index (stand-in CUDA torch, the SGLang simulator, real CPU torch
    and fla), served to the fleet."""
    from sandbox import pkgindex
    index = pkgindex.Index(fleet.site).start()
    yield index
    index.stop()


# sudo with a password takes every step sudo without one does, and more; NOPASSWD sudo alone (a
# cloud image's) is asked for by the tests that start from such an image, and by test_become_fleet.
LOGINS = ["root", "ubuntu-sudo-pass"]


def pytest_generate_tests(metafunc):
    """A test marked `logins` runs as root and logged in as `ubuntu` with password sudo
    (SPECOPS_BECOME_PASS, set by Sandbox.inv); `logins(*flavours)` names its own."""
    marker = metafunc.definition.get_closest_marker("logins")
    if marker:
        metafunc.parametrize("login", list(marker.args) or LOGINS, indirect=True)


@pytest.fixture
def login(request):
    return getattr(request, "param", "root")


@pytest.fixture
def sandbox(fleet, tmp_path, login):
    box = Sandbox(fleet, tmp_path, login)
    yield box
    for name in box.flavoured:  # later tests log in as root
        box.reset(name, flavour="root")


@pytest.fixture(scope="module")
def hub(fleet, pkg_index):
    """The sandbox hub (olah behind the gate), one per test module (test_weights_fleet.py,
    test_weights_refused_fleet.py, test_weights_running_fleet.py; support/weights.py's helpers deploy
    from it)."""
    from sandbox import hub as hub_mod
    from support import weights
    weights.INDEX["package_index"] = f"{pkg_index.url}/simple"  # the hosts' weights tool venv installs from it
    h = hub_mod.Hub(fleet.site).start()
    yield h
    h.stop()


@pytest.fixture
def routed(sandbox, pkg_index):
    """The router's host linked to each of its three workers' (support/router.py; test_router_fleet.py,
    test_router_status_fleet.py): (hosts, links, the package index)."""
    from sandbox import peerlink
    from support.router import ROUTER, WORKERS
    hosts = {n: sandbox.reset(n) for n in WORKERS + [ROUTER]}
    links = {w: peerlink.up(hosts[ROUTER], hosts[w])[1] for w in WORKERS}
    yield hosts, links, pkg_index
    for w in WORKERS:
        peerlink.down(hosts[ROUTER], hosts[w])


@pytest.fixture
def written(tmp_path):
    """`inv monitoring`'s files for the router fleet of support/monitoring.py (fleet()), with an
    Alertmanager (test_monitoring.py, test_monitoring_alerts.py)."""
    from specops.fleetwide import prometheus
    from support.monitoring import fleet as router_fleet
    out = tmp_path / "prom"
    prometheus.write(router_fleet(tmp_path), out, "30s", ["am.example:9093"])
    return out


@pytest.fixture
def agent_dirs(tmp_path, monkeypatch):
    """The agent's releases and stacks directories, in the test's own directory (test_stack_prune.py,
    test_stack_build.py)."""
    from specops.agent import releases
    from specops.agent.converge import stacks
    rel, st = tmp_path / "releases", tmp_path / "venvs"
    rel.mkdir(mode=0o700)
    st.mkdir(mode=0o755)
    monkeypatch.setattr(releases, "RELEASES", str(rel))
    monkeypatch.setattr(stacks, "STACKS_DIR", str(st))
    return releases, stacks, rel, st


@pytest.fixture
def started():
    """Processes a test starts, killed after it whatever happened (test_sandbox_index.py,
    test_sandbox_up.py)."""
    procs = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(5)


# ---- docs/RELIABILITY.md, from the outcomes of the marked tests (tests/support/reliability.py) ----

_outcomes: dict = {}
_security: dict = {}
_found: dict = {}


def pytest_configure(config):
    # Each session (each xdist worker) starts with an empty memo of its own: no verdict kept by an
    # earlier session, or by the user's own runs, is seen.
    os.environ["SPECOPS_MEMO"] = tempfile.mkdtemp(prefix="specops-memo-")
    config.addinivalue_line("markers", "reliability(case, kind): a row of docs/RELIABILITY.md")
    config.addinivalue_line("markers", "security(case, attack): a row of docs/RELIABILITY.md's security table")
    config.addinivalue_line("markers", "found(key): this test covers a case found while writing the tests "
                                       "(tests/support/reliability.py FOUND[key]): a line of docs/RELIABILITY.md")
    config.addinivalue_line("markers", "logins(*flavours): run once per login (default: root, ubuntu-sudo-pass)")


def pytest_unconfigure(config):
    memo = os.environ.pop("SPECOPS_MEMO", None)
    if memo:
        shutil.rmtree(memo, ignore_errors=True)


def _outcome(item, report):
    """What docs/RELIABILITY.md says of a test: its outcome, what it recorded (each call of
    record_inputs adds to `bad_inputs`), and whether it used sandbox hosts (a unit test if not)."""
    from support.reliability import Outcome
    props: dict = {}
    for key, value in report.user_properties:
        if key == "bad_inputs":
            props.setdefault(key, []).extend(value)
        else:
            props[key] = value
    sandbox = item.get_closest_marker("fleet") is not None or "fleet" in getattr(item, "fixturenames", ())
    return Outcome(report.outcome, props, sandbox)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each report of a marked test carries its rows (on a test worker, the item is not at hand
    where the reports are gathered: pytest_runtest_logreport, on the controller)."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" and report.outcome == "passed":
        return
    rows = [(name, mark.args) for name in ("reliability", "security", "found") for mark in item.iter_markers(name)]
    if rows:
        o = _outcome(item, report)
        report.user_properties.append(("specops_rows", {"rows": rows, "outcome": list(o)}))


def pytest_runtest_logreport(report):
    from support.reliability import Outcome
    for key, value in report.user_properties:
        if key != "specops_rows":
            continue
        o = Outcome(*value["outcome"])
        for name, args in value["rows"]:
            if name == "reliability":
                case, kind = args
                _outcomes.setdefault(case, {"kind": kind, "tests": {}})["tests"][report.nodeid] = o
            elif name == "security":
                case, attack = args
                _security.setdefault(case, {"attack": attack, "tests": {}})["tests"][report.nodeid] = o
            else:
                _found.setdefault(args[0], {})[report.nodeid] = o


def pytest_sessionfinish(session, exitstatus):
    from support.reliability import DOC, render
    if not _outcomes or hasattr(session.config, "workerinput"):  # a worker: the controller writes it
        return
    text = render(_outcomes, _security, _found)
    if os.environ.get("SPECOPS_WRITE_RELIABILITY"):
        DOC.write_text(text)
    elif os.environ.get("CI") == "true" and DOC.read_text() != text:
        DOC.with_suffix(".md.new").write_text(text)
        print(f"\n{DOC} differs from what this run's outcomes give (written to {DOC.with_suffix('.md.new')}); "
              "regenerate it with SPECOPS_WRITE_RELIABILITY=1 and commit it", file=sys.stderr)
        session.exitstatus = 1
