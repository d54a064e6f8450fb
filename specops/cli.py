"""What every task shares: options, host selection, error → exit code, the recap."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

from invoke import Exit

from . import inventory as inv
from .errors import SpecopsError, UsageError
from .run import HostRun, Options, Redactor, Reporter, recap, run_hosts

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = os.environ.get("SPECOPS_INVENTORY", str(ROOT / "inventory"))

HELP = {
    "host": "Host name(s), comma-separated (default: every host in the inventory)",
    "group": "Every host in this inventory group",
    "inventory": f"Inventory directory or hosts file (default: {DEFAULT_INVENTORY})",
    "check": "Probe for real and show what would change, with diffs; change nothing",
    "diff": "Show unified diffs of changed files",
    "json": "Also write the per-host report as JSON to this path",
    "accept-new-host-key": "Trust and record host keys not yet in known_hosts (never a changed key)",
    "forks": "Hosts run in parallel at most (default 10)",
    "quiet": "Show only changes, failures and the recap",
    "serial": "Rolling batches of this many hosts (default: all at once)",
    "max-fail": "Percent of a batch that may fail before later batches are skipped (default 100)",
    "break-lock": "Take the host lock even if another run holds it (only when that run is gone)",
}


def select(inventory: str | None, host: str | None, group: str | None) -> list[inv.Host]:
    return inv.load(inventory or DEFAULT_INVENTORY).select(host, group)


def play(body: Callable[[HostRun], None], roles: list, *, inventory=None, host=None, group=None,
         check=False, diff=False, json=None, accept_new_host_key=False, forks=10, quiet=False,
         stream=None, serial=0, max_fail=100.0, break_lock=False, task="run",
         exit_on_failure=True) -> list:
    """Select hosts, run `body` on each, print the recap, exit non-zero on any failure."""
    try:
        hosts = select(inventory, host, group)
        if not hosts:
            raise UsageError("no hosts selected")
        if serial < 0 or not 0 <= max_fail <= 100:
            raise UsageError("--serial must be >= 0 and --max-fail between 0 and 100")
        out = Reporter(Redactor(hosts), show_diff=diff or check, verbose=not quiet, stream=stream)
        opts = Options(check=check, diff=diff, accept_new=accept_new_host_key, forks=forks,
                       serial=serial, max_fail=float(max_fail), break_lock=break_lock, task=task)
        reports = run_hosts(hosts, body, roles, opts, out)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise Exit(code=2)
    except SpecopsError as e:
        print(f"error: {e}", file=sys.stderr)
        raise Exit(code=e.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise Exit(code=130)
    code = recap(reports, out, json)
    if code and exit_on_failure:
        raise Exit(code=code)
    return reports


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
