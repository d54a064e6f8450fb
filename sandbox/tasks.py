"""`inv sandbox.up` / `inv sandbox.down`: local stand-in GPU boxes for demos and tests.

Sandbox hosts get an inventory of their own (never beside a real fleet's), so a task
aimed at them must be pointed at it: `inv deploy --inventory sandbox/inventory --host sandbox`.
"""
import sys
from pathlib import Path

from invoke import Exit

from sandbox import fleet, logins, provision


LEGACY = Path(__file__).resolve().parent.parent / "inventory" / "sandbox.yml"


def _no_legacy_inventory() -> None:
    """Older versions wrote the sandbox's hosts beside the user's inventory: take that file away."""
    if LEGACY.exists():
        LEGACY.unlink()
        print(f"removed {LEGACY} (written by an older `inv sandbox.up`): sandbox hosts now have "
              f"an inventory of their own")


def up(hosts: int = 1, flavour: str = "root") -> None:
    names = ["sandbox"] if hosts == 1 else [f"sandbox{i}" for i in range(1, hosts + 1)]
    site = fleet.DEFAULT_SITE
    _no_legacy_inventory()
    try:
        f = fleet.Fleet(names, layers=[provision.layer("gpubox")], site=site, flavour=flavour).up()
    except (fleet.BootError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise Exit(code=1)
    path = provision.write_inventory(f)
    print(f"{len(names)} sandbox host(s) up; their inventory: {path}\n"
          f"  e.g. inv deploy --inventory {path} --host {names[0]}")
    if flavour == "ubuntu-sudo-pass":
        print(f"  sudo asks for ubuntu's password: add --ask-become-pass and type the one in "
              f"{site.state / 'become_pass'}")


def down() -> None:
    site = fleet.DEFAULT_SITE
    fleet.sweep(site)
    provision.remove_inventory(site)
    _no_legacy_inventory()
    print("sandbox hosts removed")
