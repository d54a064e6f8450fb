"""The test run's sandbox: the hosts each test worker boots, on a site of the worker's own, and
Sandbox, a test's view of them (inventories, host resets, specops runs); run_inv, the CLI with
its --json report; role, an ad-hoc role for engine tests.  tests/conftest.py's fixtures hand
them out."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from pathlib import Path

import yaml

from roles import VOCABULARY
from sandbox import fleet as fleet_mod, provision
from specops import inventory as inventory_mod
from specops.run import Options, Redactor, Reporter, run_hosts
from support import ROOT
from support.files import load_json

FLEET_HOSTS = ["t1", "t2", "t3", "t4", "t5"]
# Apart from `inv sandbox.up`'s site, so a user's sandbox and a test run never sweep each other;
# each test worker (scripts/test.sh runs two, pytest-xdist) has a fleet, hub and index of its own.
WORKER_SITES = {"gw0": fleet_mod.Site("sot", "192.168.235", Path("/var/lib/specops-test")),
                "gw1": fleet_mod.Site("sou", "192.168.240", Path("/var/lib/specops-test-gw1"))}
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
if WORKER not in WORKER_SITES:
    raise RuntimeError(f"test worker {WORKER}: the sandbox has sites for {len(WORKER_SITES)} workers "
                       f"(tests/support/site.py WORKER_SITES); run with -n {len(WORKER_SITES)} or fewer")
TEST_SITE = WORKER_SITES[WORKER]


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


def role(name: str, make_ops, reprobe: bool = False):
    """An ad-hoc role for engine tests: make_ops(host) -> list[Op]."""
    return types.SimpleNamespace(NAME=name, ops=make_ops, REPROBE=reprobe)


def run_inv(sandbox, inv, *args, **kw):
    """The CLI with a --json report: (its result, the report's hosts, or None if it wrote none)."""
    report = sandbox.tmp / f"r{time.monotonic_ns()}.json"
    res = sandbox.inv(*args, "--json", str(report), inventory=inv, **kw)
    return res, (load_json(report)["hosts"] if report.exists() else None)
