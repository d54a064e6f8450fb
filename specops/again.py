"""A command as the user would type it next: the one place a hint that names a command
(`carry it onto sglang 0.5.24 with: inv patch ...`) is written, so that it repeats the option
that chose the inventory and names the host it is about, and pasted runs against the same ones.

The inventory is the option the user gave (as given: the hint is pasted where they typed it);
none given, the hint gives none either, and $SPECOPS_INVENTORY or inventory/ choose it again as
they did.  cli's task wrapper says which for the length of a task (`chosen`).  A module of its
own, importing nothing of specops: every layer that words a hint (flows/, fleetwide/, sglang/)
reads it."""
from __future__ import annotations

import shlex
from contextlib import contextmanager

_given: list[str] = []  # ["--inventory", PATH] while a task given --inventory runs


class Filled(str):
    """A word a template fills in later (Prometheus's {{ $labels.host }}): written as it is."""


@contextmanager
def chosen(inventory: str | None):
    """While the block runs, hints repeat `--inventory INVENTORY` (None: no inventory option)."""
    before = list(_given)
    _given[:] = ["--inventory", inventory] if inventory else []
    try:
        yield
    finally:
        _given[:] = before


def command(task: str, *words: str, host: str | None = None) -> str:
    """`inv TASK [--inventory PATH] [--host HOST] WORDS...`, each word quoted as a shell needs."""
    line = ["inv", task, *_given, *(["--host", host] if host else []), *words]
    return " ".join(w if isinstance(w, Filled) else shlex.quote(w) for w in line)
