"""Shared fixtures: one sandbox fleet per session, inventories written per test."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox import fleet as fleet_mod, provision  # noqa: E402
from specops.run import Options, Redactor, Reporter, run_hosts  # noqa: E402
from specops import inventory as inventory_mod  # noqa: E402

FLEET_HOSTS = ["t1", "t2", "t3", "t4", "t5"]
# Apart from `inv sandbox.up`'s site, so a user's sandbox and a test run never sweep each other.
TEST_SITE = fleet_mod.Site("sot", "192.168.235", Path("/var/lib/specops-test"))


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="fleet tests need root (network namespaces, nspawn)")
        for item in items:
            if "fleet" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def fleet():
    """Five booted sandbox hosts with SGLang (simulator) preinstalled, reused by every test."""
    f = fleet_mod.Fleet(FLEET_HOSTS, layers=[provision.layer("gpubox")], site=TEST_SITE).up()
    provision.write_known_hosts(f)
    yield f
    f.down()


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

    def __init__(self, fleet: fleet_mod.Fleet, tmp: Path):
        self.fleet, self.tmp = fleet, tmp

    def host(self, name: str) -> fleet_mod.Host:
        return self.fleet[name]

    def reset(self, name: str, layers=None) -> fleet_mod.Host:
        h = self.fleet.reset(name, layers)
        provision.write_known_hosts(self.fleet)  # a reset host has a new host key
        return h

    def inventory(self, hosts: dict[str, dict], group_vars: dict | None = None) -> Path:
        """Write an inventory for these fleet hosts: {name: extra vars}."""
        entries = {}
        for name, extra in hosts.items():
            h = self.fleet[name] if name in FLEET_HOSTS else None
            base = provision.host_vars(h) if h else {}
            entries[name] = {**base, **extra}
        doc = {"all": {"vars": {"venv": provision.VENV, **(group_vars or {})},
                       "children": {"fleet": {"hosts": entries}}}}
        path = self.tmp / "inventory"
        path.mkdir(exist_ok=True)
        (path / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def inv(self, *args: str, inventory: Path | None = None, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run the real CLI, as a user would."""
        cmd = [sys.executable, "-m", "invoke", *args]
        full_env = {**os.environ, **(env or {})}
        if inventory:
            full_env["SPECOPS_INVENTORY"] = str(inventory)
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=full_env, stdin=subprocess.DEVNULL)

    def apply(self, inventory: Path, roles: list, check: bool = False, host: str | None = None,
              body=None, **opt):
        """Run roles in-process through the engine; returns (reports, printed output)."""
        import io
        hosts = inventory_mod.load(inventory).select(host, None)
        buf = io.StringIO()
        out = Reporter(Redactor(hosts), show_diff=True, stream=buf)
        reports = run_hosts(hosts, body or (lambda run: run.converge()), roles,
                            Options(check=check, **opt), out)
        return reports, buf.getvalue()


@pytest.fixture
def sandbox(fleet, tmp_path):
    return Sandbox(fleet, tmp_path)


def role(name: str, make_ops, reprobe: bool = False):
    """An ad-hoc role for engine tests: make_ops(host) -> list[Op]."""
    return types.SimpleNamespace(NAME=name, ops=make_ops, REPROBE=reprobe)


def sha256_on(h: fleet_mod.Host, *paths: str) -> dict:
    out = h.run("sha256sum", *paths, check=False).stdout
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def unit_prop(h: fleet_mod.Host, unit: str, prop: str) -> str:
    return h.run("systemctl", "show", unit, "-p", prop, "--value").stdout.strip()


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
