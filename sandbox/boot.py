"""One sandbox host's life on this machine: its network namespace and veth, its overlay
filesystem (a fresh host key, the controller's key, its logins), systemd-nspawn booting it, the
waits for sshd and systemd, and its stop and teardown; the inotify limit many hosts need."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from sandbox import cgroups, logins
from sandbox.base import controller_key, log, sh


def network_up(h) -> None:
    sh("ip", "netns", "add", h.netns)
    sh("ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
    sh("ip", "addr", "add", f"{h.gateway}/30", "dev", h.veth)
    sh("ip", "link", "set", h.veth, "up")
    ns = ("ip", "-n", h.netns)
    sh(*ns, "addr", "add", f"{h.address}/30", "dev", "eth0")
    sh(*ns, "link", "set", "eth0", "up")
    sh(*ns, "link", "set", "lo", "up")
    sh(*ns, "route", "add", "default", "via", h.gateway)


def filesystem_up(h, lowers: list[Path]) -> None:
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


def start_time(pid: int) -> str:
    """A process's start time (clock ticks since boot, /proc/PID/stat's 22nd field): with its pid,
    what names one process across its exec and apart from a later one given the same pid."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def start(h) -> None:
    logf = open(h.dir / "console.log", "wb")
    proc = subprocess.Popen(cgroups.argv(h.netns, [
        "systemd-nspawn", "-q", "-D", str(h.merged), "--boot", "--register=no", "--keep-unit",
        f"--network-namespace-path=/run/netns/{h.netns}", f"--machine={h.name}",
        "--capability=all", "--resolv-conf=off"]),
        stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    (h.dir / "nspawn.pid").write_text(f"{proc.pid} {start_time(proc.pid)}")


def wait_ssh(h, timeout: float = 60) -> None:
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


def container_pid(h) -> int | None:
    """PID 1 of the container (systemd), the child of systemd-nspawn."""
    pid = h.pid()
    if pid is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return int(children[0]) if children else None
    except OSError:
        return None


class BootError(RuntimeError):
    """A sandbox host did not boot; the message is one line with the tail of its console."""


def console_tail(h, chars: int = 300) -> str:
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


def wait_system(h, timeout: float = 60) -> None:
    # sshd answers before systemd has finished booting; systemctl calls made
    # too early race with the boot transaction.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = h.run("systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(0.3)
    raise RuntimeError(f"{h.name}: systemd did not finish booting within {timeout:.0f}s")


def stop(h, grace: float = 8) -> None:
    pid = h.pid()
    if pid is None:
        return
    # SIGTERM to nspawn asks the container's systemd for a clean shutdown.
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and h.pid() is not None:
        time.sleep(0.1)
    if h.pid() is not None:
        # Killing the container's init takes its whole PID namespace with it;
        # killing only nspawn would leave the container running, re-parented.  Its init is read
        # now, as nspawn's child: a pid read before the grace may have ended and been reused.
        for target in (container_pid(h), pid):
            try:
                os.kill(target, signal.SIGKILL)
            except (OSError, TypeError):
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and h.pid() is not None:
            time.sleep(0.1)


def teardown_one(h) -> None:
    if os.path.ismount(h.merged):
        sh("umount", "-l", str(h.merged), check=False)
    sh("ip", "link", "del", h.veth, check=False)
    sh("ip", "netns", "del", h.netns, check=False)
    cgroups.remove(lambda name: name == h.netns)
    shutil.rmtree(h.dir, ignore_errors=True)
