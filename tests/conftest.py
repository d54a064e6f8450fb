"""Shared fixtures: one sandbox fleet per session, inventories written per test."""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# A suite started with SIGINT ignored (a background job of a non-interactive shell, nohup, some CI
# runners) would pass that on to every process a test interrupts, and Python then never raises
# KeyboardInterrupt there: each process of the suite takes Ctrl-C as Python does by default, and
# its children (exec resets a handled signal) start with SIGINT's default.
signal.signal(signal.SIGINT, signal.default_int_handler)

from sandbox import fleet as fleet_mod, provision  # noqa: E402
from specops.run import Options, Redactor, Reporter, run_hosts  # noqa: E402
from specops import inventory as inventory_mod  # noqa: E402
from roles import VOCABULARY  # noqa: E402

FLEET_HOSTS = ["t1", "t2", "t3", "t4", "t5"]
# Apart from `inv sandbox.up`'s site, so a user's sandbox and a test run never sweep each other;
# each test worker (scripts/test.sh runs two, pytest-xdist) has a fleet, hub and index of its own.
WORKER_SITES = {"gw0": fleet_mod.Site("sot", "192.168.235", Path("/var/lib/specops-test")),
                "gw1": fleet_mod.Site("sou", "192.168.240", Path("/var/lib/specops-test-gw1"))}
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
if WORKER not in WORKER_SITES:
    raise RuntimeError(f"test worker {WORKER}: the sandbox has sites for {len(WORKER_SITES)} workers "
                       f"(tests/conftest.py WORKER_SITES); run with -n {len(WORKER_SITES)} or fewer")
TEST_SITE = WORKER_SITES[WORKER]


def pytest_collection_modifyitems(config, items):
    """Without root the fleet cannot run.  That fails the run (CI must not pass on unit tests
    alone), unless SPECOPS_SKIP_FLEET=1 asks explicitly for the unit tests only."""
    from reliability import FOUND
    for item in items:
        for mark in item.iter_markers("found"):
            if mark.args[0] not in FOUND:
                raise pytest.UsageError(f"{item.nodeid}: found({mark.args[0]!r}): no such story in tests/reliability.py")
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
LONGEST = ["test_router_fleet.py", "test_leftovers_fleet.py", "test_monitoring_fleet.py", "test_traffic_fleet.py",
           "test_lifecycle_fleet.py", "test_specbench_fleet.py", "test_weights_fleet.py", "test_upgrade_fleet.py"]


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


class Sandbox:
    """Per-test view of the fleet: inventories, host resets and specops runs."""

    def __init__(self, fleet: fleet_mod.Fleet, tmp: Path, login: str = "root"):
        self.fleet, self.tmp, self.login = fleet, tmp, login
        self.flavoured: set[str] = set()  # hosts reset to a non-root login, set back after the test

    def host(self, name: str) -> fleet_mod.Host:
        return self.fleet[name]

    def reset(self, name: str, layers=None, flavour: str | None = None) -> fleet_mod.Host:
        """Boot the host afresh; `flavour`: how it is logged into (sandbox/logins.py; default:
        the test's login)."""
        flavour = flavour or self.login
        h = self.fleet.reset(name, layers, flavour)
        if flavour != "root":
            self.flavoured.add(name)
        provision.write_known_hosts(self.fleet)  # a reset host has a new host key
        return h

    def inventory(self, hosts: dict[str, dict], group_vars: dict | None = None) -> Path:
        """Write an inventory for these fleet hosts: {name: extra vars}.  Every host runs the venv
        the gpubox layer made (a `venv:` of the user's) unless group_vars says {"venv": None}: then
        specops builds the host's stack."""
        entries = {}
        for name, extra in hosts.items():
            h = self.fleet[name] if name in FLEET_HOSTS else None
            base = provision.host_vars(h) if h else {}
            entries[name] = {**base, **extra}
        shared = {k: v for k, v in {"venv": provision.VENV, **(group_vars or {})}.items() if v is not None}
        doc = {"all": {"vars": shared,
                       "children": {"fleet": {"hosts": entries}}}}
        path = self.tmp / "inventory"
        path.mkdir(exist_ok=True)
        (path / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def login_env(self) -> dict:
        """What a user of a password-sudo host sets: the become password."""
        if self.login != "ubuntu-sudo-pass":
            return {}
        from sandbox import logins
        return {"SPECOPS_BECOME_PASS": logins.password(self.fleet.site.state)}

    def inv(self, *args: str, inventory: Path | None = None, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run the real CLI, as a user would."""
        cmd = [sys.executable, "-m", "invoke", *args]
        full_env = {**os.environ, **self.login_env(), **(env or {})}
        if inventory:
            full_env["SPECOPS_INVENTORY"] = str(inventory)
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=full_env, stdin=subprocess.DEVNULL)

    def interrupt(self, *args: str, inventory: Path, when, before=None) -> tuple[int, str]:
        """Run the CLI, send it SIGINT (Ctrl-C) when a line contains `when` (or, a function, when
        `when(lines so far)` is true), after calling `before`, if given, while it still runs;
        returns (exit status, output)."""
        import signal
        proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, **self.login_env(), "SPECOPS_INVENTORY": str(inventory)})
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if (when(seen) if callable(when) else when in line):
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
        hosts = inventory_mod.load(inventory, VOCABULARY).select(host, None)
        buf = io.StringIO()
        out = Reporter(Redactor(hosts), show_diff=True, stream=buf)
        reports = run_hosts(hosts, body or (lambda run: run.converge()), roles,
                            Options(check=check, **opt), out)
        return reports, buf.getvalue()


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


def role(name: str, make_ops, reprobe: bool = False):
    """An ad-hoc role for engine tests: make_ops(host) -> list[Op]."""
    return types.SimpleNamespace(NAME=name, ops=make_ops, REPROBE=reprobe)


def sha256_on(h: fleet_mod.Host, *paths: str) -> dict:
    """path → sha256 on the host; every path must exist (a missing one fails the test, it does not
    quietly drop out of the comparison)."""
    out = h.run("sha256sum", *paths).stdout
    found = {line.split()[1]: line.split()[0] for line in out.splitlines()}
    assert set(found) == set(paths), f"missing on {h.name}: {sorted(set(paths) - set(found))}"
    return found


@contextmanager
def watching_ps(h: fleet_mod.Host, secret: str, every: float = 0.1):
    """While the block runs, the host's `ps -eww` every `every` s: yields the list of the outputs
    that showed `secret` (the block asserts it stayed empty)."""
    seen: list[str] = []
    done = threading.Event()

    def watch():
        while not done.is_set() and not seen:
            out = h.run("ps", "-eww", "-o", "user,pid,args", check=False).stdout
            if secret in out:
                seen.append(out)
            time.sleep(every)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def flock_waiters(path) -> list[int]:
    """The pids waiting for an flock on `path`, as /proc/locks lists them: each blocked request on a
    line of its own, '->' before it.  What a test waits for instead of a sleep that hopes a process
    got there."""
    st = os.stat(path)
    ident = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    with open("/proc/locks") as f:
        rows = [line.split() for line in f]
    return [int(r[5]) for r in rows if len(r) > 6 and r[1] == "->" and r[2] == "FLOCK" and r[6] == ident]


MANAGED = ["/etc/systemd/system/sglang.service", "/etc/specops/sglang.env", "/usr/local/lib/specops/launch.py"]


def host_snapshot(h: fleet_mod.Host, *extra: str, unit: str = "sglang") -> dict:
    """What must not move when a run changes nothing: the service's start (µs monotonic stamp) and
    the sha256 of every managed file."""
    return {"started": unit_prop(h, unit, "ExecMainStartTimestampMonotonic"),
            "files": sha256_on(h, *MANAGED, *extra)}


def unit_prop(h: fleet_mod.Host, unit: str, prop: str) -> str:
    return h.run("systemctl", "show", unit, "-p", prop, "--value").stdout.strip()


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# ---- docs/RELIABILITY.md, from the outcomes of the marked tests (tests/reliability.py) ----

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
                                       "(tests/reliability.py FOUND[key]): a line of docs/RELIABILITY.md")
    config.addinivalue_line("markers", "logins(*flavours): run once per login (default: root, ubuntu-sudo-pass)")


def pytest_unconfigure(config):
    memo = os.environ.pop("SPECOPS_MEMO", None)
    if memo:
        shutil.rmtree(memo, ignore_errors=True)


def _outcome(item, report):
    """What docs/RELIABILITY.md says of a test: its outcome, what it recorded (each call of
    record_inputs adds to `bad_inputs`), and whether it used sandbox hosts (a unit test if not)."""
    from reliability import Outcome
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
    from reliability import Outcome
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


def record_inputs(record_property, *inputs) -> None:
    """A bad-input test's inputs, recorded as it tries them (before its asserts): docs/RELIABILITY.md
    counts these, each once per row (tests/reliability.py: count_inputs), not test items.  One call
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


def pytest_sessionfinish(session, exitstatus):
    from reliability import DOC, render
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
