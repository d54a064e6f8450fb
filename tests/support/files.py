"""Files on this machine (the controller): a JSON file read (a run's --json report), and the
processes waiting for a file's lock."""
from __future__ import annotations

import json
import os
from pathlib import Path

def flock_waiters(path) -> list[int]:
    """The pids waiting for an flock on `path`, as /proc/locks lists them: each blocked request on a
    line of its own, '->' before it.  What a test waits for instead of a sleep that hopes a process
    got there."""
    st = os.stat(path)
    ident = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    with open("/proc/locks") as f:
        rows = [line.split() for line in f]
    return [int(r[5]) for r in rows if len(r) > 6 and r[1] == "->" and r[2] == "FLOCK" and r[6] == ident]


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
