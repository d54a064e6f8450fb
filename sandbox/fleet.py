"""Local stand-in GPU boxes: systemd-nspawn containers with real systemd and sshd.

Each host gets an overlayfs over one cached Debian root, its own network
namespace joined to the controller by a veth pair, a fresh SSH host key and
the sandbox controller key in authorized_keys.  Everything is named with the
``sop`` prefix so that setup can sweep leftovers of a killed earlier run.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sandbox import boot, cgroups, logins
from sandbox.base import STATE, controller_key, log, rootfs, sh

MAX_HOSTS = 63


@dataclass(frozen=True)
class Site:
    """Where a fleet lives: its name prefix, its /24 and its state directory.

    The /24 is carved into /30s: the controller end of host k is .4k+1, the host .4k+2.
    A second site lets a test simulate a killed run without touching the shared fleet.
    """
    prefix: str = "sop"
    subnet: str = "192.168.231"
    state: Path = STATE
    inventory: Path | None = None  # the sandbox's own inventory directory (default: state/inventory)

    @property
    def inventory_dir(self) -> Path:
        return self.inventory or self.state / "inventory"


def _site_from_env() -> Site:
    """SPECOPS_SANDBOX_SITE=prefix,subnet,state puts `inv sandbox.*` somewhere else (tests use it);
    by default its inventory is sandbox/inventory in this repository."""
    spec = os.environ.get("SPECOPS_SANDBOX_SITE")
    if not spec:
        return Site(inventory=Path(__file__).resolve().parent / "inventory")
    prefix, subnet, state = spec.split(",")
    return Site(prefix, subnet, Path(state))


DEFAULT_SITE = _site_from_env()


@dataclass
class Host:
    name: str
    index: int
    site: Site = DEFAULT_SITE
    flavour: str = "root"  # how it is logged into (sandbox/logins.py)

    @property
    def netns(self) -> str:
        return f"{self.site.prefix}-{self.name}"

    @property
    def veth(self) -> str:
        return f"{self.site.prefix}v{self.index}"

    @property
    def address(self) -> str:
        return f"{self.site.subnet}.{4 * self.index + 2}"

    @property
    def gateway(self) -> str:
        return f"{self.site.subnet}.{4 * self.index + 1}"

    @property
    def dir(self) -> Path:
        return self.site.state / "hosts" / self.name

    @property
    def merged(self) -> Path:
        return self.dir / "merged"

    @property
    def host_key_pub(self) -> str:
        return (self.dir / "upper/etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[1]

    def pid(self) -> int | None:
        """The pid of this host's systemd-nspawn, or None: a pid file whose process is gone (a
        killed run's) or is another (a pid taken since a reboot: its start time differs) names no
        process of ours, and nothing may signal it (boot.stop, sweep).  A pid file of one field
        (written before the start time was) is checked by the command line, nspawn's -D."""
        try:
            pid, *started = (self.dir / "nspawn.pid").read_text().split()
            pid = int(pid)
        except (OSError, ValueError):
            return None
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if we started it and it has exited
        except ChildProcessError:
            pass
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if started[:1] != [boot.start_time(pid)] if started else str(self.merged) not in _argv(pid):
                return None
        except (OSError, IndexError):
            return None
        return None if state in ("Z", "X") else pid

    def run(self, *argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command inside the booted host, bypassing SSH (for test set-up and oracles)."""
        res = subprocess.run(["nsenter", "-t", str(boot.container_pid(self)), "-m", "-u", "-i", "-n", "-p",
                              "--", *argv], capture_output=True, text=True, input=input)
        if check and res.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(argv)}: {res.stderr.strip()}")
        return res

    def path(self, inside: str) -> Path:
        """A path inside the host, as seen from the controller."""
        return self.merged / inside.lstrip("/")


class Fleet:
    """Boot, reset and tear down sandbox hosts.  Safe to re-run after a crash."""

    def __init__(self, names: list[str], layers: list[Path] = (), site: Site = DEFAULT_SITE,
                 flavour: str = "root"):
        """`layers` are extra overlay layers above the root filesystem, topmost first; `flavour`
        says how the hosts are logged into (sandbox/logins.py)."""
        if len(names) >= MAX_HOSTS:
            raise ValueError(f"at most {MAX_HOSTS - 1} sandbox hosts")
        logins.check(flavour)
        self.site = site
        self.hosts = [Host(n, i + 1, site, flavour) for i, n in enumerate(names)]
        self.layers = list(layers)

    def __getitem__(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def up(self) -> "Fleet":
        boot.raise_inotify_limit(len(self.hosts))  # first: another site's hosts may be booting too
        sweep(self.site)
        lowers = self.layers + [rootfs()]
        controller_key()
        t0 = time.monotonic()
        with ThreadPoolExecutor(max(1, len(self.hosts))) as pool:
            failed = [e for e in pool.map(lambda h: self._try_up(h, lowers), self.hosts) if e]
        if failed:
            raise boot.BootError(f"{len(failed)} of {len(self.hosts)} host(s) did not boot; first: {failed[0]}")
        log(f"{len(self.hosts)} host(s) up in {time.monotonic() - t0:.1f}s")
        return self

    def _try_up(self, h: Host, lowers: list[Path]) -> str | None:
        """Boot one host; None, or one line saying why not with the tail of its console."""
        try:
            self._up_one(h, lowers)
            return None
        except RuntimeError as e:
            return f"{e} (console: {boot.console_tail(h)})"

    def _up_one(self, h: Host, lowers: list[Path]) -> None:
        boot.network_up(h)
        boot.filesystem_up(h, lowers)
        boot.start(h)
        boot.wait_ssh(h)
        boot.wait_system(h)

    def down(self) -> None:
        with ThreadPoolExecutor(max(1, len(self.hosts))) as pool:
            list(pool.map(boot.stop, self.hosts))
        sweep(self.site)

    def reset(self, name: str, layers: list[Path] | None = None, flavour: str = "root") -> Host:
        """Throw away everything the host has written and boot it afresh (logged into as `flavour`)."""
        logins.check(flavour)
        h = self[name]
        h.flavour = flavour
        lowers = (self.layers if layers is None else layers) + [rootfs()]
        for attempt in (1, 2):
            boot.stop(h)
            boot.teardown_one(h)
            try:
                self._up_one(h, lowers)
                return h
            except RuntimeError as e:
                # Seen once with 20 hosts resetting at once on 2 cores: one retry, then say why.
                if attempt == 2:
                    raise boot.BootError(f"{e} (console: {boot.console_tail(h)})") from None
                log(f"{name}: boot failed ({e}); retrying once. Console: {boot.console_tail(h)}")
                time.sleep(1)
        return h

    def known_hosts(self) -> str:
        return "".join(f"{h.address} ssh-ed25519 {h.host_key_pub}\n" for h in self.hosts)


def service_address(site: Site) -> str:
    """A controller address every host reaches through its gateway: for the package index."""
    return f"{site.subnet}.254"


def service_address_up(site: Site) -> None:
    # On lo: the controller delivers locally whatever arrives for one of its own addresses.
    if service_address(site) not in sh("ip", "-o", "addr", "show", "dev", "lo").stdout:
        sh("ip", "addr", "add", f"{service_address(site)}/32", "dev", "lo")


def service_address_down(site: Site) -> None:
    if service_address(site) in sh("ip", "-o", "addr", "show", "dev", "lo").stdout:
        sh("ip", "addr", "del", f"{service_address(site)}/32", "dev", "lo", check=False)


def _argv(pid: str | int) -> list[str]:
    """A process's command line, [] once it is gone."""
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return []
    return text.rstrip("\0").split("\0") if text else []


def running(site: Site) -> list[str]:
    """The names of the site's hosts whose systemd-nspawn runs: what `up`, which sweeps the site
    first, would throw away.  A pid file whose process is gone (a killed run's) or runs something
    else (a pid taken since a reboot) is no running host: nothing of it serves, or can without an `up`."""
    hosts_dir = site.state / "hosts"
    found = []
    for d in sorted(hosts_dir.iterdir()) if hosts_dir.is_dir() else []:
        h = Host(d.name, 0, site)
        if h.pid() is not None:
            found.append(h.name)
    return found


def sweep(site: Site = DEFAULT_SITE) -> None:
    """Remove every sandbox host of the site, running or left behind by a killed run."""
    hosts_dir = site.state / "hosts"
    if hosts_dir.exists():
        leftovers = [Host(d.name, 0, site) for d in hosts_dir.iterdir()]
        with ThreadPoolExecutor(max(1, len(leftovers))) as pool:
            list(pool.map(boot.stop, leftovers))
    # What a killed run may have left without a record: find it on the machine itself.
    marker = f"{hosts_dir}/"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        cmd = " ".join(_argv(pid))
        if cmd.startswith("systemd-nspawn") and marker in cmd:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            for target in children + [pid]:
                try:
                    os.kill(int(target), signal.SIGKILL)
                except OSError:
                    pass
    for line in Path("/proc/mounts").read_text().splitlines():
        mountpoint = line.split()[1]
        if mountpoint.startswith(marker):
            sh("umount", "-l", mountpoint, check=False)
    shutil.rmtree(hosts_dir, ignore_errors=True)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(f"{site.prefix}v"):
            sh("ip", "link", "del", name, check=False)
    service_address_down(site)
    cgroups.remove(lambda name: name.startswith(f"{site.prefix}-"))
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0]
        if name.startswith(f"{site.prefix}-"):
            sh("ip", "netns", "del", name, check=False)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "rootfs"
    if cmd == "rootfs":
        print(rootfs())
    elif cmd == "sweep":
        sweep()
