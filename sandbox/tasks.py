"""inv sandbox.up / sandbox.down: local stand-in GPU boxes for demos and tests."""
from pathlib import Path

from invoke import task

from specops.cli import DEFAULT_INVENTORY

# Beside the user's hosts.yml, so `inv deploy --host sandbox` finds it with no extra flag.
INVENTORY = Path(DEFAULT_INVENTORY) / "sandbox.yml"


@task(help={"hosts": "How many hosts to boot (default 1: 'sandbox'; more: sandbox1..N)"})
def up(c, hosts=1):
    """Boot sandbox hosts (systemd + sshd in nspawn containers) and write inventory/sandbox.yml."""
    from sandbox import fleet, provision  # only sandbox tasks pay for these imports
    names = ["sandbox"] if hosts == 1 else [f"sandbox{i}" for i in range(1, hosts + 1)]
    INVENTORY.parent.mkdir(parents=True, exist_ok=True)
    f = fleet.Fleet(names, layers=[provision.layer("gpubox")]).up()
    INVENTORY.write_text(provision.inventory_yaml(f))
    print(f"{len(names)} sandbox host(s) up; inventory written to {INVENTORY}")


@task
def down(c):
    """Stop every sandbox host and remove its network namespace, veth and mounts."""
    from sandbox import fleet
    fleet.sweep(fleet.DEFAULT_SITE)
    INVENTORY.unlink(missing_ok=True)
    print("sandbox hosts removed")
