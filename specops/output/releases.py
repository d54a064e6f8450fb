"""What `inv releases` prints: each host's releases, newest last (* marks current), with the
spec-bench record each keeps and what changed since the last measured one."""
from __future__ import annotations

import shutil
import sys

from ..flows import specbench
from .report import shorten


def width() -> int | None:
    """A terminal's width, to which a release's summary is shortened; None when the output is not a
    terminal (a pipe, a file): lines whole, for grep and scripts."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def lines(host: str, releases: list[dict], columns: int | None = None) -> list[str]:
    """The listing of one host's releases; `columns`: see width()."""
    out = []
    for rel in releases:
        head = f"{host:<12} {'*' if rel['current'] else ' '} {rel['stamp']}  {rel['status']:<11} " \
               f"{', '.join(rel['services'])}  "
        out.append(head + (shorten(rel["summary"], columns - len(head)) if columns else rel["summary"]))
        for name, perf in sorted((rel.get("perf") or {}).items()):
            out.append(f"{'':<14} perf {name}: {specbench.perf_line(perf)}")
        measured = [p for p in releases if p.get("perf") and p["stamp"] < rel["stamp"]]
        for line in specbench.compare(measured[-1], rel) if rel.get("perf") and measured else []:
            out.append(f"{'':<16} since {measured[-1]['stamp']}: {line}")
    return out
