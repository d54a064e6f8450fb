"""SGLang's router in front of a group's workers (its venv is router_stack's): an 0600 env file
(its API key), the unit (the workers' URLs on its command line, so a restart or a reboot brings
the whole fleet back), running.  It needs no GPU and no model."""
from specops import handlers
from specops.errors import UsageError
from specops.layout import API_KEY_ENV, env_file
from specops.ops import File, RunningCode, Service, render, unit_file
from specops.services import kind_of, of_host, of_kind
from specops.services.router import workers_of
from specops.unitfmt import envfile_line, exec_line

NAME = "router"


def unit_text(host, svc):
    kind = kind_of(svc)
    resolved = {**svc, "worker_urls": [w.url for w in workers_of(host, svc)]}
    props = kind.properties(svc)
    return render("sglang.service.j2", description=f"SGLang router {svc['name']}", env_file=env_file(svc["name"]),
                  environment=[], exec_start=exec_line(kind.argv(resolved, kind.venv(svc))),
                  timeout_stop_sec=props["TimeoutStopSec"], limit_nofile=props["LimitNOFILE"])


def env_text(svc):
    secrets = {API_KEY_ENV: svc["api_key"]} if svc.get("api_key") else {}
    return render("sglang.env.j2", name=svc["name"], secrets=[envfile_line(k, v) for k, v in sorted(secrets.items())])


def check(host, routers):
    """Plan-time: one port per service on the host, and workers the router can reach."""
    ports = [k.port(s) for k, s in of_host(host)]
    for svc in routers:
        port = kind_of(svc).port(svc)
        if ports.count(port) > 1:
            raise UsageError(f"{host.name}: router {svc['name']!r}: port {port} is taken by another service of the host")
        workers_of(host, svc)


def ops(host):
    routers = of_kind(host, "router")
    if not routers:
        return []
    check(host, routers)
    out = []  # the env directory and the launcher are the SGLang service role's (on every host)
    for svc in routers:
        kind, name = kind_of(svc), svc["name"]
        venv = kind.venv(svc)
        out += [
            File(env_file(name), env_text(svc), mode="0600", secret=True, notify=[handlers.restart(name)]),
            unit_file(name, unit_text(host, svc)),
            Service(name, state="started", enabled=True, unit=kind.unit(svc)),
            RunningCode(name, kind.managed(svc, venv)),
        ]
    return out
