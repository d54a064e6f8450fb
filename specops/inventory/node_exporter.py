"""A host's `monitoring:` var, read once for the monitoring role, the textfile step, the port
check and Prometheus's targets: whether node_exporter runs there, the directory its textfile
collector reads, and how often specops's timer rewrites the textfile."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError
from ..layout import TEXTFILE_DIR
from .checker import Pattern


# The directory goes into a unit's ExecStart and ReadWritePaths: a plain absolute path only.
PLAIN_PATH = Pattern(r"^(?!.*/\.\.(/|$))/[A-Za-z0-9._/-]+$",
                     "a textfile_dir is a plain absolute path (letters, digits and . _ - /, no ..)")


@dataclass(frozen=True)
class Settings:
    textfile_dir: str
    refresh: str


def settings(host) -> Settings | None:
    """The settings of a monitored host (`monitoring: true`, or a mapping of them), or None; a
    directory that is not PLAIN_PATH is refused (the inventory's check says so first)."""
    m = host.get("monitoring")
    if not m:
        return None
    m = m if isinstance(m, dict) else {}
    where = m.get("textfile_dir") or TEXTFILE_DIR
    if not re.fullmatch(PLAIN_PATH.regex, where):
        raise UsageError(f"{host.name}: monitoring.textfile_dir: {PLAIN_PATH.rule}, not {where!r}")
    return Settings(textfile_dir=where, refresh=m.get("refresh") or "1min")


def monitored(host) -> bool:
    """Whether the monitoring role runs node_exporter on the host."""
    return bool(host.get("monitoring"))
