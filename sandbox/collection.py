"""The sandbox's own tasks, `inv sandbox.up`, `inv sandbox.traffic`, `inv sandbox.down`: local stand-in
GPU boxes for demos and tests.  Each imports its module when it runs: `import tasks` (every
`inv` run) pays for none of the sandbox."""
import sys

from invoke import Collection, Exit, task

from specops import cli
from specops.errors import UsageError

# Numbers are taken as text and read by cli.whole, which refuses a bad one in one line: invoke
# casts a value to its default's type, and a cast that fails ends in a traceback.


@task(name="up", help={"hosts": "How many hosts to boot (default 1: 'sandbox'; more: sandbox1..N)",
                        "flavour": "How they are logged into: root (default), ubuntu-sudo (a cloud image: "
                                   "`ubuntu` with sudo, no root logins) or ubuntu-sudo-pass (sudo asks a password)"})
@cli.one_line
def sandbox_up(c, hosts="1", flavour="root"):
    """Boot local sandbox hosts (systemd + sshd in nspawn containers) and write their own
    inventory (sandbox/inventory), apart from yours."""
    from sandbox import fleet, logins, tasks as sandbox_tasks  # only sandbox tasks pay for the sandbox's imports
    count = cli.whole(hosts, "--hosts", 1, fleet.MAX_HOSTS - 1)  # before up() touches anything
    if flavour not in logins.FLAVOURS:
        raise UsageError(f"--flavour: give one of {', '.join(logins.FLAVOURS)} (got {flavour!r})")
    sandbox_tasks.up(count, flavour)


@task(name="traffic", help={"accept_rate": "The draft's acceptance on every sandbox host from now on, 0 to 1 (the "
                                          "traffic moved away from what it was trained on), or off: the "
                                          "simulator's own again; default: leave it",
                             "seconds": "How long to send requests (default 60; 0: none)",
                             "clients": "Requests in flight per server (default 2)"})
@cli.one_line
def sandbox_traffic(c, accept_rate="", seconds="60", clients="2"):
    """Send requests to the sandbox's servers for a while, with their draft's acceptance moved or
    put back: what makes a demo's draft stop paying, for Prometheus and `inv status` to see."""
    from sandbox import traffic
    rate = traffic.accept_rate(accept_rate)
    seconds, clients = cli.whole(seconds, "--seconds", 0), cli.whole(clients, "--clients", 1)
    try:
        print(traffic.traffic(rate, seconds, clients))
    except (ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise Exit(code=1)


@task(name="down")
def sandbox_down(c):
    """Stop every sandbox host and remove its network namespace, veth, mounts and inventory."""
    from sandbox import tasks as sandbox_tasks
    sandbox_tasks.down()


collection = Collection("sandbox", sandbox_up, sandbox_traffic, sandbox_down)
