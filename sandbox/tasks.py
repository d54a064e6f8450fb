"""`inv sandbox.up` / `inv sandbox.down`: local stand-in GPU boxes for demos and tests.

Sandbox hosts get an inventory of their own (never beside a real fleet's), so a task
aimed at them must be pointed at it: `inv deploy --inventory sandbox/inventory --host sandbox`.
Their SGLang is a stack built from the sandbox's package index (sandbox/pkgindex.py), which
`up` starts as a process of its own that outlives it, and `down` stops.
"""
import subprocess
import sys
from pathlib import Path

from invoke import Exit

from sandbox import aptrepo, base, boot, fleet, logins, pkgindex, provision


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
        f = fleet.Fleet(names, layers=[provision.layer("gpubox")], site=site, flavour=flavour)
        said = replacing(site)
        if said:  # a deploy made on it (the README's first command's) would otherwise vanish unsaid
            base.log(said)
        f.up()
        url = _index_up(site)
        node_exporter = aptrepo.controller_deb("prometheus-node-exporter")
        for h in f.hosts:  # a mirror of the sandbox's own: what `monitoring: true` installs from
            aptrepo.serve(h, [], remove=False, debs=(node_exporter,))
    except (boot.BootError, ValueError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise Exit(code=1)
    path = provision.write_inventory(f)
    other = next(v for v in provision.SIM_VERSIONS if v not in (provision.SIM_VERSION, provision.SIM_FAILING))
    print(f"{len(names)} sandbox host(s) up; their inventory: {path}\n"
          f"  e.g. inv deploy --inventory {path} --host {names[0]}\n"
          f"package index: {url}/simple (running until `inv sandbox.down`; pid in {site.state / pkgindex.PID_FILE})\n"
          f"  SGLang versions: {', '.join(provision.SIM_VERSIONS)} (the simulator; {provision.SIM_FAILING} "
          f"fails at start, on purpose)\n"
          f"  the inventory pins {provision.SIM_VERSION}: to upgrade, set sglang: {{version: {other}}} there, "
          f"and deploy (its comment says more)")
    if flavour == "ubuntu-sudo-pass":
        print(f"  sudo asks for ubuntu's password: add --ask-become-pass and type the one in "
              f"{site.state / 'become_pass'}")


def replacing(site: fleet.Site) -> str | None:
    """What `up` says before its sweep when hosts of the site run: that it replaces them, and what
    goes with them; None when none runs.  It replaces rather than keeps them: the tutorial's first
    step wants a fresh host (its `--check` shows what a first deploy changes), whatever ran before.
    The site's hosts.yml is written anew too: an edit to it (the tutorial's upgrade) goes."""
    names = fleet.running(site)
    if not names:
        return None
    hosts, its = ("running host", "its") if len(names) == 1 else (f"{len(names)} running hosts", "their")
    inventory = site.inventory_dir / "hosts.yml"
    also = f", and {inventory} is written anew" if inventory.exists() else ""
    return f"replacing the {hosts} {', '.join(names)}: {its} deploys, services and files go{also}"


def _index_up(site: fleet.Site) -> str:
    """The site's package index, serving on the service address: the one running is left alone
    (the hosts' sweep took its address away: it gets it back), else it is built and started."""
    url = pkgindex.url_of(site)
    if pkgindex.recorded(site) is not None:
        fleet.service_address_up(site)
        base.log(f"package index already running at {url}")
        return url
    pkgindex.stop_recorded(site)  # a stale pid file goes (nothing is killed)
    base.log("building the package index (stand-in torch, each SGLang simulator release)")
    pkgindex.Index(site).start(detached=True)
    return url


def down() -> None:
    site = fleet.DEFAULT_SITE
    try:
        stopped = pkgindex.stop_recorded(site)
    except RuntimeError as e:  # the hosts go all the same
        stopped = e
    fleet.sweep(site)  # the hosts, and the service address on lo
    provision.remove_inventory(site)
    _no_legacy_inventory()
    if isinstance(stopped, RuntimeError):
        print(f"error: {stopped}", file=sys.stderr)
        raise Exit(code=1)
    print(("package index stopped; " if stopped == "stopped" else "") + "sandbox hosts removed")
