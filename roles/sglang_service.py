"""The SGLang systemd unit: validated spec flags, an 0600 env file for secrets, the unit
(checked by the installed SGLang's own resolver before it replaces the old one), running."""
import re
from pathlib import Path

from specops.errors import UsageError
from specops.ops import Change, Context, Directory, Facts, File, Op, RunningCode, Service, render, unit_file
from specops.spec import API_KEY_ENV, DEFAULT_VENV, expectations, launch_args, venv_python
from specops.unitfmt import envfile_line, exec_line, unit_environment

NAME = "sglang_service"
ENV_DIR = "/etc/specops"
RESOLVER = (Path(__file__).resolve().parent.parent / "specops" / "resolver.py").read_text()
UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")


def env_file(svc):
    return f"{ENV_DIR}/{svc['name']}.env"


def unit_text(svc, venv):
    argv = [venv_python(venv), "-m", "sglang.launch_server", *launch_args(svc)]
    expand = {}
    if svc.get("api_key"):
        # The key comes from the 0600 env file, so the world-readable unit never holds it.
        argv += ["--api-key", API_KEY_ENV]
        expand = {len(argv) - 1: API_KEY_ENV}
    env = dict(svc.get("env") or {})
    if svc.get("cuda_visible_devices"):
        env["CUDA_VISIBLE_DEVICES"] = svc["cuda_visible_devices"]
    return render("sglang.service.j2", name=svc["name"], model_path=svc["model_path"],
                  env_file=env_file(svc), exec_start=exec_line(argv, expand),
                  environment=[unit_environment(k, v) for k, v in sorted(env.items())],
                  timeout_stop_sec=svc.get("timeout_stop_sec", 120),
                  limit_nofile=svc.get("limit_nofile", 65535))


def env_text(svc):
    secrets = dict(svc.get("env_secret") or {})
    if svc.get("api_key"):
        secrets[API_KEY_ENV] = svc["api_key"]
    return render("sglang.env.j2", name=svc["name"],
                  secrets=[envfile_line(k, v) for k, v in sorted(secrets.items())])


class Preflight(Op):
    """Before a changed unit replaces the old one, the installed SGLang resolves its arguments.

    It runs first in the apply batch, after every file has been staged and validated but
    before any is renamed, so a refusal leaves the running service and its unit untouched.
    """

    def __init__(self, svc, venv, unit: File):
        self.svc, self.venv, self.unit = svc, venv, unit
        intended, accepted = expectations(svc, svc["name"])
        self.expect = {k: accepted.get(k, v) for k, v in intended.items()}

    def wants(self):
        return {"files": [self.unit.path]}

    def plan(self, facts: Facts, ctx: Context):
        target = f"preflight {self.svc['name']}"
        if facts.file(self.unit.path).get("sha256") == self.unit.sha256:
            return self._change(target, "ok")
        # A check, not a change: the host is the same afterwards, so it counts as ok.
        return Change(self.role, target, False, "the installed SGLang resolves the new arguments", "", [{
            "kind": "preflight", "python": venv_python(self.venv), "script": RESOLVER,
            "argv": launch_args(self.svc), "expect": self.expect, "service": self.svc["name"],
            "desc": f"preflight {self.svc['name']}: the installed SGLang resolves the new arguments"}])


def check(host, services):
    """Plan-time checks, before any connection."""
    names, ports = set(), set()
    for svc in services:
        where = f"{host.name}: service {svc['name']!r}"
        if not UNIT_NAME.match(svc["name"]):
            raise UsageError(f"{where}: a service name may hold only letters, digits and _ . @ -")
        port = svc.get("port", 30000)
        if svc["name"] in names or port in ports:
            raise UsageError(f"{where}: service names and ports must be unique on a host")
        names.add(svc["name"])
        ports.add(port)
        expectations(svc, where)  # SGLang's flag rules


def sources(svc, venv):
    """Every managed file the running service depends on: it must have started after them."""
    from roles.draft_config import draft_config_path
    from roles.model_patches import patch_key
    out = [f"/etc/systemd/system/{svc['name']}.service", env_file(svc)]
    out += [patch_key(venv, rel) for rel in svc.get("patches") or []]
    if svc.get("draft_config"):
        out.append(draft_config_path(svc))
    return out


def ops_for_service(svc, venv):
    unit = unit_file(svc["name"], unit_text(svc, venv))
    return [
        File(env_file(svc), env_text(svc), mode="0600", secret=True, notify=[f"restart:{svc['name']}"]),
        Preflight(svc, venv, unit),
        unit,
        Service(svc["name"], state="started", enabled=True),
        RunningCode(svc["name"], sources(svc, venv)),
    ]


def ops(host):
    venv = host.get("venv", DEFAULT_VENV)
    services = host.get("services") or []
    check(host, services)
    out = [Directory(ENV_DIR, mode="0700")]
    for svc in services:
        out += ops_for_service(svc, venv)
    return out
