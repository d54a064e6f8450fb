"""What every sandbox host and build stands on: the Debian root filesystem each host boots from
(debootstrap, built once and cached), the controller's SSH key, and the helpers the sandbox's
builders share: `sh`, `log`, and `built_once` (one build at a time across test workers)."""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SUITE = "bookworm"
PACKAGES = ["systemd", "systemd-sysv", "openssh-server", "python3", "python3-venv",
            "dbus", "iproute2", "curl", "ca-certificates", "procps", "sudo", "rsync"]
CACHE = Path(os.environ.get("SPECOPS_ROOTFS_CACHE", "/var/cache/specops"))
STATE = Path(os.environ.get("SPECOPS_SANDBOX_STATE", "/var/lib/specops-sandbox"))


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
