"""Local stand-in GPU boxes: systemd-nspawn containers with real systemd and sshd.

Each host gets an overlayfs over one cached Debian root, its own network
namespace joined to the controller by a veth pair, a fresh SSH host key and
the sandbox controller key in authorized_keys.  Everything is named with the
``sop`` prefix so that setup can sweep leftovers of a killed earlier run.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sandbox import cgroups, logins

SUITE = "bookworm"
PACKAGES = ["systemd", "systemd-sysv", "openssh-server", "python3", "python3-venv",
            "dbus", "iproute2", "curl", "ca-certificates", "procps", "sudo", "rsync"]
CACHE = Path(os.environ.get("SPECOPS_ROOTFS_CACHE", "/var/cache/specops"))
STATE = Path(os.environ.get("SPECOPS_SANDBOX_STATE", "/var/lib/specops-sandbox"))
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


def log(msg: str) -> None:
    print(f"[sandbox] {msg}", file=sys.stderr, flush=True)


def sh(*argv: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip() or res.stdout.strip()}")
    return res


def built_once(build):
    """Runs `build` holding a lock of its own in the cache: two test workers (pytest -n) that want
    the same cached build at once get one build, the second finding it complete.  `build` itself
    returns early when its result is complete."""
    @functools.wraps(build)
    def locked(*args, **kwargs):
        CACHE.mkdir(parents=True, exist_ok=True)
        # 0600: another user who could open it could hold its lock, and every build with it
        fd = os.open(CACHE / f".{build.__module__}.{build.__qualname__}.lock",
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "r+") as lock:
            os.fchmod(fd, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
            return build(*args, **kwargs)
    return locked


@built_once
def rootfs() -> Path:
    """The cached Debian root, built once by debootstrap (about a minute)."""
    key = hashlib.sha256(f"{SUITE}:{','.join(PACKAGES)}".encode()).hexdigest()[:10]
    root = CACHE / f"rootfs-{SUITE}-{key}"
    if (root / ".complete").exists():
        return root
    for tool in ("debootstrap", "systemd-nspawn"):
        if not shutil.which(tool):
            raise RuntimeError(f"{tool} is missing: apt-get install debootstrap systemd-container")
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    log(f"building root filesystem {root} with debootstrap (about a minute, cached afterwards)")
    t0 = time.monotonic()
    sh("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp))
    _prepare_base(tmp)
    (tmp / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    tmp.rename(root)
    log(f"root filesystem ready in {time.monotonic() - t0:.0f}s")
    return root


def _prepare_base(root: Path) -> None:
    # Host keys are made per host, so each sandbox host has an identity of its own.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    # No DNS here: an unreachable resolver stalls every lookup (getfqdn in HTTPServer).
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").write_text("")
    sshd = root / "etc/ssh/sshd_config.d/sandbox.conf"
    sshd.write_text("PermitRootLogin prohibit-password\nUseDNS no\nMaxStartups 100:30:200\n"
                    "MaxSessions 50\n")
    # Units that only slow the boot of a container or fail in one.
    for unit in ("systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer",
                 "e2scrub_all.timer", "fstrim.timer", "getty@tty1.service"):
        (root / "etc/systemd/system" / unit).unlink(missing_ok=True)
        os.symlink("/dev/null", root / "etc/systemd/system" / unit)


@built_once
def controller_key() -> Path:
    """The sandbox controller's SSH key, made once (shared by every site)."""
    key = STATE / "id_ed25519"
    if not key.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specops-sandbox", "-f", str(key))
    return key


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
        try:
            pid = int((self.dir / "nspawn.pid").read_text())
        except (OSError, ValueError):
            return None
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if we started it and it has exited
        except ChildProcessError:
            pass
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return None
        return None if state in ("Z", "X") else pid

    def run(self, *argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command inside the booted host, bypassing SSH (for test set-up and oracles)."""
        res = subprocess.run(["nsenter", "-t", str(_container_pid(self)), "-m", "-u", "-i", "-n", "-p",
                              "--", *argv], capture_output=True, text=True, input=input)
        if check and res.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(argv)}: {res.stderr.strip()}")
        return res

    def path(self, inside: str) -> Path:
        """A path inside the host, as seen from the controller."""
        return self.merged / inside.lstrip("/")


def _network_up(h: Host) -> None:
    sh("ip", "netns", "add", h.netns)
    sh("ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
    sh("ip", "addr", "add", f"{h.gateway}/30", "dev", h.veth)
    sh("ip", "link", "set", h.veth, "up")
    ns = ("ip", "-n", h.netns)
    sh(*ns, "addr", "add", f"{h.address}/30", "dev", "eth0")
    sh(*ns, "link", "set", "eth0", "up")
    sh(*ns, "link", "set", "lo", "up")
    sh(*ns, "route", "add", "default", "via", h.gateway)


def _filesystem_up(h: Host, lowers: list[Path]) -> None:
    for d in ("upper", "work", "merged"):
        (h.dir / d).mkdir(parents=True, exist_ok=True)
    upper = h.dir / "upper"
    (upper / "etc/ssh").mkdir(parents=True, exist_ok=True)
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{h.name}",
       "-f", str(upper / "etc/ssh/ssh_host_ed25519_key"))
    (upper / "root/.ssh").mkdir(parents=True, exist_ok=True, mode=0o700)
    pub = controller_key().with_suffix(".pub").read_text()
    (upper / "root/.ssh/authorized_keys").write_text(pub)
    logins.write(upper, lowers, h.flavour, pub, h.site.state)
    (upper / "etc/hostname").write_text(h.name + "\n")
    (upper / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {h.name}\n")
    sh("mount", "-t", "overlay", "overlay", "-o",
       f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={h.dir / 'work'}",
       str(h.merged))


def _boot(h: Host) -> None:
    logf = open(h.dir / "console.log", "wb")
    proc = subprocess.Popen(cgroups.argv(h.netns, [
        "systemd-nspawn", "-q", "-D", str(h.merged), "--boot", "--register=no", "--keep-unit",
        f"--network-namespace-path=/run/netns/{h.netns}", f"--machine={h.name}",
        "--capability=all", "--resolv-conf=off"]),
        stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    (h.dir / "nspawn.pid").write_text(str(proc.pid))


def _wait_ssh(h: Host, timeout: float = 60) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if h.pid() is None:
            raise RuntimeError(f"{h.name}: container exited during boot, see {h.dir}/console.log")
        try:
            with socket.create_connection((h.address, 22), timeout=1) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{h.name}: sshd did not answer within {timeout:.0f}s")


def _container_pid(h: Host) -> int | None:
    """PID 1 of the container (systemd), the child of systemd-nspawn."""
    pid = h.pid()
    if pid is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return int(children[0]) if children else None
    except OSError:
        return None


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
        raise_inotify_limit(len(self.hosts))  # first: another site's hosts may be booting too
        sweep(self.site)
        lowers = self.layers + [rootfs()]
        controller_key()
        t0 = time.monotonic()
        with ThreadPoolExecutor(max(1, len(self.hosts))) as pool:
            failed = [e for e in pool.map(lambda h: self._try_up(h, lowers), self.hosts) if e]
        if failed:
            raise BootError(f"{len(failed)} of {len(self.hosts)} host(s) did not boot; first: {failed[0]}")
        log(f"{len(self.hosts)} host(s) up in {time.monotonic() - t0:.1f}s")
        return self

    def _try_up(self, h: Host, lowers: list[Path]) -> str | None:
        """Boot one host; None, or one line saying why not with the tail of its console."""
        try:
            self._up_one(h, lowers)
            return None
        except RuntimeError as e:
            return f"{e} (console: {console_tail(h)})"

    def _up_one(self, h: Host, lowers: list[Path]) -> None:
        _network_up(h)
        _filesystem_up(h, lowers)
        _boot(h)
        _wait_ssh(h)
        _wait_system(h)

    def down(self) -> None:
        with ThreadPoolExecutor(max(1, len(self.hosts))) as pool:
            list(pool.map(_stop, self.hosts))
        sweep(self.site)

    def reset(self, name: str, layers: list[Path] | None = None, flavour: str = "root") -> Host:
        """Throw away everything the host has written and boot it afresh (logged into as `flavour`)."""
        logins.check(flavour)
        h = self[name]
        h.flavour = flavour
        lowers = (self.layers if layers is None else layers) + [rootfs()]
        for attempt in (1, 2):
            _stop(h)
            _teardown_one(h)
            try:
                self._up_one(h, lowers)
                return h
            except RuntimeError as e:
                # Seen once with 20 hosts resetting at once on 2 cores: one retry, then say why.
                if attempt == 2:
                    raise BootError(f"{e} (console: {console_tail(h)})") from None
                log(f"{name}: boot failed ({e}); retrying once. Console: {console_tail(h)}")
                time.sleep(1)
        return h

    def known_hosts(self) -> str:
        return "".join(f"{h.address} ssh-ed25519 {h.host_key_pub}\n" for h in self.hosts)


class BootError(RuntimeError):
    """A sandbox host did not boot; the message is one line with the tail of its console."""


def console_tail(h: Host, chars: int = 300) -> str:
    try:
        text = (h.dir / "console.log").read_text(errors="replace")
    except OSError:
        return "no console log"
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]", "", text)  # colours, cursor moves
    return " | ".join(line.strip() for line in text[-chars:].splitlines() if line.strip()) or "empty"


INOTIFY = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_HOST = 16  # a booted container's systemd, journald, logind and sshd hold about 8


def raise_inotify_limit(hosts: int) -> None:
    """Each container's systemd needs inotify instances, and all containers count against root's
    limit (128 by default: about 15 hosts).  Raise it, and say so."""
    try:
        current = int(INOTIFY.read_text())
    except (OSError, ValueError):
        return
    want = max(1024, 128 + INOTIFY_PER_HOST * hosts)
    if current < want:
        INOTIFY.write_text(str(want))
        log(f"raised fs.inotify.max_user_instances from {current} to {want} (each host's systemd needs some)")


def _wait_system(h: Host, timeout: float = 60) -> None:
    # sshd answers before systemd has finished booting; systemctl calls made
    # too early race with the boot transaction.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = h.run("systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(0.3)
    raise RuntimeError(f"{h.name}: systemd did not finish booting within {timeout:.0f}s")


def _stop(h: Host, grace: float = 8) -> None:
    pid = h.pid()
    if pid is None:
        return
    init = _container_pid(h)
    # SIGTERM to nspawn asks the container's systemd for a clean shutdown.
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and h.pid() is not None:
        time.sleep(0.1)
    if h.pid() is not None:
        # Killing the container's init takes its whole PID namespace with it;
        # killing only nspawn would leave the container running, re-parented.
        for target in (init, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except (OSError, TypeError):
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and h.pid() is not None:
            time.sleep(0.1)


def _teardown_one(h: Host) -> None:
    if os.path.ismount(h.merged):
        sh("umount", "-l", str(h.merged), check=False)
    sh("ip", "link", "del", h.veth, check=False)
    sh("ip", "netns", "del", h.netns, check=False)
    cgroups.remove(lambda name: name == h.netns)
    shutil.rmtree(h.dir, ignore_errors=True)


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


def sweep(site: Site = DEFAULT_SITE) -> None:
    """Remove every sandbox host of the site, running or left behind by a killed run."""
    hosts_dir = site.state / "hosts"
    if hosts_dir.exists():
        leftovers = [Host(d.name, 0, site) for d in hosts_dir.iterdir()]
        with ThreadPoolExecutor(max(1, len(leftovers))) as pool:
            list(pool.map(_stop, leftovers))
    # What a killed run may have left without a record: find it on the machine itself.
    marker = f"{hosts_dir}/"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
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
