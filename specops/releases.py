"""Release stamps: the controller names a deploy's release before it changes anything."""
from __future__ import annotations

import time

from .layout import RELEASES


def new_stamp() -> str:
    """UTC, sortable, unique to the microsecond (tests deploy twice within a second)."""
    now = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def release_dir(stamp: str) -> str:
    return f"{RELEASES}/{stamp}"
