"""SGLang's router in front of a group's workers (its venv is router_stack's): an 0600 env file
(its API key), the unit (the workers' URLs on its command line, so a restart or a reboot brings
the whole fleet back), running.  It needs no GPU and no model."""
from specops.ops import handlers
from specops.layout import env_file
from specops.ops import File, RunningCode, Service, unit_file
from specops.ops.users import service_users
from specops.kinds import kind_of, of_kind
from specops.kinds.ports import check_ports
from specops.kinds.router import workers_of
from specops.kinds.unitfile import env_text, unit_text

NAME = "router"
VARS = {}  # the host vars it reads
AFTER = ("router_stack",)  # the roles it runs after, when they run


def router_unit_text(host, svc):
    """The router's unit: every worker's URL on its command line."""
    return unit_text({**svc, "worker_urls": [w.url for w in workers_of(host, svc)]}, kind_of(svc).venv(svc))


def check(host, routers):
    """Plan-time: one listener per port on the host, and workers the router can reach."""
    check_ports(host)
    for svc in routers:
        workers_of(host, svc)


def ops(host):
    routers = of_kind(host, "router")
    if not routers:
        return []
    check(host, routers)
    out = service_users(host, routers)  # the env directory and the launcher are the SGLang service role's
    for svc in routers:
        kind, name = kind_of(svc), svc["name"]
        venv = kind.venv(svc)
        out += [
            File(env_file(name), env_text(svc), mode="0600", secret=True, notify=[handlers.restart(name)]),
            unit_file(name, router_unit_text(host, svc)),
            Service(name, enabled=True, unit=kind.unit(svc)),
            RunningCode(name, kind.managed(svc, venv)),
        ]
    return out
