"""A unit's ExecStart read back as the words systemd runs: the one reader, for the controller (a
unit's diff, the venv a unit runs) and the agent (the interpreter a release's unit would run).
ops/unitfmt.py writes what this reads: each word double-quoted, `$` as `$$`, `%` as `%%`."""
from __future__ import annotations

import re
import shlex

EXEC_START = "ExecStart="
_LINE = re.compile(r"^ExecStart=(.*)$", re.M)


def exec_words(value: str) -> list[str] | None:
    """An ExecStart value as its words (exec_line's inverse, and a hand-written line's reading);
    None where it does not parse."""
    try:
        words = shlex.split(value)
    except ValueError:
        return None
    return [w.replace("$$", "$").replace("%%", "%") for w in words]


def interpreter(unit_text: str | None) -> str | None:
    """The program a unit's first ExecStart runs (specops's units put no prefix before it); None
    when it has none, or one that does not parse."""
    m = _LINE.search(unit_text or "")
    words = exec_words(m.group(1).strip()) if m else None
    return words[0] if words else None
