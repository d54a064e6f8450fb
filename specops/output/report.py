"""What leaves specops for a person or a script: lines per host, the recap, --json; never a secret."""
from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from .. import outfile
from ..remote import become
from .. import kinds
from ..sglang import indexes
from ..ops import Change

ROLLED_BACK = "rolled back"  # the note after which a host runs another release than the one it verified
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0, DEL, C1 (\x9b: CSI)


class Redactor:
    """Replaces every secret value of the selected hosts' services, their index URLs' passwords
    (and the become password) wherever text leaves specops, as it is and in every escaped form it
    can take on the way (JSON, a unit's or an env file's quoting)."""

    def __init__(self, hosts: list):
        values = [*kinds.secrets(hosts), *(s for h in hosts for s in indexes.secrets(h)), become.password() or ""]
        secrets = {form for s in values if len(s) >= 4 for form in _forms(s)}
        self.secrets = sorted(secrets, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, "***")
        return text

    def data(self, value: Any) -> Any:
        """Redact every string inside a JSON-able value (before it is serialised, so escaping
        cannot hide a secret)."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, list):
            return [self.data(v) for v in value]
        if isinstance(value, dict):
            return {self(k) if isinstance(k, str) else k: self.data(v) for k, v in value.items()}
        return value


def _forms(secret: str) -> set[str]:
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
             "".join("\\" + c if c in '"\\`$' else c for c in secret),  # an env file's quoting
             secret.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("%", "%%")}  # a unit's
    return {f for f in forms if len(f) >= 4}


def shorten(text: str, room: int) -> str:
    """`text` in `room` characters, cut after a whole word or item and marked with an ellipsis
    (never inside a figure or a path); text with no place to cut stays whole."""
    if len(text) <= room:
        return text
    cut = text[:max(room, 1) - 1]
    at = cut.rfind(" ")
    return text if at <= 0 else cut[:at].rstrip(",;:") + " …"


def accept_text(value: Any) -> str:
    """An accept length as a person reads it: two decimals ("2.91", never 2.909090909090909);
    "-" where none was measured (or a record holds something else)."""
    return f"{value:.2f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


class Reporter:
    """Thread-safe, redacted output: a line per change, diffs on request, a recap."""

    def __init__(self, redact: Redactor, show_diff: bool, stream=None, verbose: bool = True):
        self.redact, self.show_diff, self.verbose = redact, show_diff, verbose
        self.stream = stream or sys.stdout
        self.lock = threading.Lock()

    def line(self, host: str, text: str) -> None:
        with self.lock:
            self.stream.write(self.redact(_CONTROL.sub("", f"{host:<12} {text}")) + "\n")
            self.stream.flush()

    def change(self, host: str, c: Change, check: bool) -> None:
        if not c.changed and not c.warning and not c.checks and not self.verbose:
            return
        if c.changed:
            state, detail = ("would change" if check else "changed"), c.summary
        elif c.checks:
            state, detail = "check", c.summary
        else:
            state, detail = "ok", ""
        self.line(host, f"{c.role:<15} {c.target}: {state}" + (f" ({detail})" if detail else "")
                  + (f" WARNING: {c.warning}" if c.warning else ""))
        if c.changed and c.diff and self.show_diff:
            with self.lock:  # a diff shows host files: their escape sequences must not reach a terminal
                self.stream.write(self.redact(_CONTROL.sub("", c.diff if c.diff.endswith("\n") else c.diff + "\n")))


@dataclass
class HostReport:
    """One host's outcome: its changes, error, notes for the recap, and what its task returned."""
    name: str
    changes: list[dict] = field(default_factory=list)
    error: str | None = None
    round_trips: int = 0
    elapsed: float = 0.0
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    result: Any = None
    started: bool = False
    doing: str = ""              # the request in flight (its kind), for an interrupted run
    last_line: str = ""          # the last thing said about this host
    cut: str | None = None       # "interrupted" | "not started": what Ctrl-C left of this host's run
    at_cut: dict = field(default_factory=dict)

    def note_once(self, text: str) -> None:
        """A note said once per release run: verifying the same release again (after spec-bench's
        baseline restarted it) adds nothing; after a rollback another release runs."""
        since = self.notes[len(self.notes) - self.notes[::-1].index(ROLLED_BACK):] \
            if ROLLED_BACK in self.notes else self.notes
        if text not in since:
            self.notes.append(text)

    def said(self, text: str) -> None:
        if self.cut:  # after Ctrl-C: what the run did about it (a lock given back, a service restored)
            then = self.at_cut.setdefault("then", [])
            if len(then) < 20:
                then.append(text)
        else:
            self.last_line = text

    def cut_short(self, applied: list[str]) -> None:
        """Ctrl-C reached this host's run while it was under way: keep where it was.  `applied`:
        the paths the host confirmed written or removed (the changes list what was planned)."""
        if not self.cut:
            self.cut, self.at_cut = "interrupted", {"during": self.doing or "connecting",
                                                    "last_line": self.last_line, "applied": applied}

    @property
    def changed(self) -> int:
        return sum(1 for c in self.changes if c["changed"])

    @property
    def ok(self) -> int:  # a change a failed batch never made is neither ok nor changed
        return sum(1 for c in self.changes if not c["changed"] and c.get("applied", True))

    @property
    def status(self) -> str:
        return self.cut or ("skipped" if "skipped" in self.notes else "failed" if self.error
                            else "changed" if self.changed else "ok")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C ended a run: every host's report as far as it got, for the recap and --json."""

    def __init__(self, reports: list[HostReport]):
        super().__init__()
        self.reports = reports


def interrupted(reports: list[HostReport]) -> Interrupted:
    """After Ctrl-C: a host whose run never began is "not started" (one under way was cut short
    when the Ctrl-C came; one that had finished keeps its outcome)."""
    for r in reports:
        if not r.started and not r.error:
            r.cut = "not started"
    return Interrupted(reports)


def looked(r: HostReport) -> str:
    """What a read-only task did on one host, in its own words: what it checked and what differs
    from the inventory (a check's "changed" is drift, nothing it did), or that it only read."""
    n = r.ok + r.changed
    said = (f"{n} checked, " + (f"{r.changed} differ" if r.changed else "none differs") + " from the inventory"
            if n else "read")
    return said + (", failed" if r.error else "")


def recap(reports: list[HostReport], out: Reporter, json_path: str | None = None, cut: bool = False,
          read_only: bool = False) -> int:
    """Print the recap (and write --json); the exit code: 1 if any host failed.  `cut`: Ctrl-C
    ended the run, and each report says how far its host got.  `read_only`: the task changed
    nothing (a check, status, verify): each host's line says what it looked at, not counters."""
    out.stream.write("\nRECAP" + (" (interrupted)" if cut else " (read only: no host changed)" if read_only else "")
                     + "\n")
    for r in reports:
        line = f"{r.name:<12} " + (looked(r) if read_only else
                                   f"ok={r.ok:<3} changed={r.changed:<3} failed={1 if r.error else 0}")
        line += f"  {r.elapsed:.1f}s"
        if r.cut:
            line += f"  {r.cut}" + (f" during {r.at_cut['during']}" if r.at_cut else "")
        if r.notes:
            line += "  " + "; ".join(r.notes)
        out.stream.write(out.redact(_CONTROL.sub("", line)) + "\n")  # notes carry what hosts said
    for status in ("failed", "skipped"):  # a host --max-fail skipped never ran: not a failure of its own
        names = [r.name for r in reports if r.error and r.status == status]
        if names:
            out.stream.write(f"{status} hosts: {', '.join(names)}\n")
    out.stream.flush()
    if json_path:
        doc = {"interrupted": cut,
               "hosts": {r.name: {"status": r.status, "ok": r.ok, "changed": r.changed,
                                  "error": r.error, "round_trips": r.round_trips,
                                  "elapsed": round(r.elapsed, 3), "notes": r.notes,
                                  "changes": r.changes, **r.extra,
                                  **({"interrupted": r.at_cut} if r.at_cut else {})} for r in reports}}
        # whole or not at all, and never through a link someone put at the name (owndir.py)
        outfile.write(json_path, (json.dumps(out.redact.data(doc), indent=2, default=str) + "\n").encode(), "--json")
    return 1 if any(r.error for r in reports) else 0
