"""What a test reads off a sandbox host, and does there: files' sha256, a unit's properties, the
snapshot that must not move when a run changes nothing, the host's `ps` watched while a block
runs, and a command run as alice, the host's unprivileged local user."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from sandbox import fleet as fleet_mod


def sha256_on(h: fleet_mod.Host, *paths: str) -> dict:
    """path → sha256 on the host; every path must exist (a missing one fails the test, it does not
    quietly drop out of the comparison)."""
    out = h.run("sha256sum", *paths).stdout
    found = {line.split()[1]: line.split()[0] for line in out.splitlines()}
    assert set(found) == set(paths), f"missing on {h.name}: {sorted(set(paths) - set(found))}"
    return found


@contextmanager
def watching_ps(h: fleet_mod.Host, secret: str, every: float = 0.1):
    """While the block runs, the host's `ps -eww` every `every` s: yields the list of the outputs
    that showed `secret` (the block asserts it stayed empty)."""
    seen: list[str] = []
    done = threading.Event()

    def watch():
        while not done.is_set() and not seen:
            out = h.run("ps", "-eww", "-o", "user,pid,args", check=False).stdout
            if secret in out:
                seen.append(out)
            time.sleep(every)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


MANAGED = ["/etc/systemd/system/sglang.service", "/etc/specops/sglang.env", "/usr/local/lib/specops/launch.py"]


def host_snapshot(h: fleet_mod.Host, *extra: str, unit: str = "sglang") -> dict:
    """What must not move when a run changes nothing: the service's start (µs monotonic stamp) and
    the sha256 of every managed file."""
    return {"started": unit_prop(h, unit, "ExecMainStartTimestampMonotonic"),
            "files": sha256_on(h, *MANAGED, *extra)}


def unit_prop(h: fleet_mod.Host, unit: str, prop: str) -> str:
    return h.run("systemctl", "show", unit, "-p", prop, "--value").stdout.strip()


def alice(h, *argv):
    """Run a command on the host as the unprivileged user alice."""
    return h.run("runuser", "-u", "alice", "--", *argv)
