"""The SGLang systemd unit: validated spec flags, an 0600 env file for secrets, the unit
(checked by the installed SGLang's own resolver before it replaces the old one), running."""
import os
from specops.inventory import schema
from pathlib import Path

from specops import protocol, remote, sglang
from specops.errors import UsageError
from specops.layout import ENV_DIR, LAUNCHER, env_file
from specops.ops import Context, Directory, Facts, File, Op, RunningCode, Service, handlers, unit_file
from specops.ops.users import service_users
from specops.kinds import kind_of, of_host, of_kind, venv_of
from specops.kinds.ports import check_ports
from specops.kinds.sglang import admin_surface
from specops.kinds.unitfile import env_text, unit_text
from specops.sglang.rules import expectations
from specops.layout import venv_python
from specops.sglang.spec import launch_args, said_as

NAME = "sglang_service"
VARS = schema.STACK_VARS  # the host vars it reads
AFTER = ("gpu_stack", "model_patches", "draft_config")  # the roles it runs after, when they run
RESOLVER = (Path(sglang.__file__).parent / "resolver.py").read_text()  # a program run by the host's SGLang
LAUNCHER_SOURCE = (Path(remote.__file__).parent / "hostfiles" / "launch.py").read_bytes()


class Preflight(Op):
    """Before a changed unit replaces the old one, the installed SGLang resolves its arguments.

    It runs first in the apply batch, after every file has been staged and validated but
    before any is renamed, so a refusal leaves the running service and its unit untouched.
    """

    def __init__(self, svc, venv, unit: File, warning: str = ""):
        self.svc, self.venv, self.unit, self.warning = svc, venv, unit, warning
        self.services = (svc["name"],)
        intended, accepted = expectations(svc, svc["name"])
        self.expect = {k: accepted.get(k, v) for k, v in intended.items()}

    def wants(self):
        return protocol.Probe(files=[self.unit.path])

    def plan(self, facts: Facts, ctx: Context):
        target = f"preflight {self.svc['name']}"
        if facts.file(self.unit.path).get("sha256") == self.unit.sha256:
            change = self._change(target, "ok")
        else:
            change = self._change(target, "the installed SGLang resolves the new arguments", checks=[protocol.Preflight(
                python=venv_python(self.venv), script=RESOLVER, argv=launch_args(self.svc), expect=self.expect,
                service=self.svc["name"], said_as=said_as(),
                desc=f"preflight {self.svc['name']}: the installed SGLang resolves the new arguments")])
        change.warning = self.warning  # an admin surface left open on purpose: said on every run
        return change


def check(host, services):
    """Plan-time checks, before any connection: names and ports, who may reach the admin endpoints,
    SGLang's flag rules."""
    check_ports(host)
    names = [svc["name"] for svc in services]
    for svc in services:
        where = f"{host.name}: service {svc['name']!r}"
        if names.count(svc["name"]) > 1:
            raise UsageError(f"{where}: service names must be unique on a host")
        admin_surface(host, svc)
        expectations(svc, where)  # SGLang's flag rules


def ops_for_service(host, svc, venv):
    unit = unit_file(svc["name"], unit_text(svc, venv))
    return [
        File(env_file(svc["name"]), env_text(svc), mode="0600", secret=True, notify=[handlers.restart(svc["name"])]),
        Preflight(svc, venv, unit, admin_surface(host, svc)),
        unit,
        Service(svc["name"], enabled=True, unit=kind_of(svc).unit(svc)),
        RunningCode(svc["name"], kind_of(svc).managed(svc, venv), kind_of(svc).weights(svc)),
    ]


def ops(host):
    venv = venv_of(host)
    services = of_kind(host, "sglang")
    check(host, services)
    out = [Directory(ENV_DIR, mode="0700"), Directory(os.path.dirname(LAUNCHER)),
           File(LAUNCHER, LAUNCHER_SOURCE, mode="0644", notify=[handlers.restart(s["name"]) for _, s in of_host(host)],
                own="specops's launcher")]
    out += service_users(host, services)
    for svc in services:
        out += ops_for_service(host, svc, venv)
    return out
