"""What every task shares: its options (declared once), host selection, error → exit code, the recap."""
from __future__ import annotations

import functools
import inspect
import json
import os
import shlex
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, NoReturn

from invoke import Exit, Task, task

from . import again, outfile, provenance
from .remote import become
from . import inventory as inv
from .inventory import multinode
from .errors import SpecopsError, UsageError
from .output.report import HostReport, Interrupted, Redactor, Reporter, recap
from .run import HostRun, Options, run_hosts

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = ROOT / "inventory"  # yours: git-ignored, made from the example
RECORDS_RELEASES = ("deploy", "bootstrap")  # the tasks (Options.task) whose runs record releases
EXAMPLE_INVENTORY = ROOT / "inventory.example"


def inventory_path(given: str | None) -> str:
    """-i, else $SPECOPS_INVENTORY, else inventory/ once the user made it.  Never the example:
    its hosts are real machines elsewhere, which a fresh clone must not reach by default."""
    chosen = given or os.environ.get("SPECOPS_INVENTORY")
    if chosen:
        return chosen
    if DEFAULT_INVENTORY.exists():
        return str(DEFAULT_INVENTORY)
    raise UsageError(f"no inventory: give -i DIR|FILE, or copy {os.path.relpath(EXAMPLE_INVENTORY)}/ "
                     f"to {os.path.relpath(DEFAULT_INVENTORY)}/ (the default) and make it yours")


@dataclass
class Selection:
    """The options tasks share: which hosts, how to reach them, how to run and report."""
    host: str | None = None
    group: str | None = None
    all: bool = False
    inventory: str | None = None
    accept_new_host_key: bool = False
    ask_become_pass: bool = False
    forks: int = 10
    json: str | None = None
    serial: int = 0
    max_fail: int = 100
    break_lock: bool = False
    quiet: bool = False
    check: bool = False
    diff: bool = False
    verify_weights: bool = False
    ways: tuple = ("host", "group", "all")  # the selection options the task has (gpu-window: host alone)


HELP = {
    "host": "Host name(s), comma-separated",
    "group": "Every host in this inventory group",
    "all": "Every host in the inventory (every task needs --host, --group or --all)",
    "inventory": "Inventory directory or hosts file (default: $SPECOPS_INVENTORY, else inventory/ once you made it)",
    "check": "Probe for real and show what would change, with diffs; change nothing",
    "diff": "Show unified diffs of changed files",
    "verify-weights": "Hash every weight file against its manifest; fetch again those that differ",
    "json": "Also write the per-host report as JSON to this path",
    "accept-new-host-key": "Trust and record host keys not yet in known_hosts (never a changed key)",
    "ask-become-pass": "Ask once for the sudo password of become hosts (or set SPECOPS_BECOME_PASS)",
    "forks": "Hosts run in parallel at most (default 10)",
    "quiet": "Show only changes, failures and the recap",
    "serial": "Rolling batches of this many hosts (default: all at once)",
    "max-fail": "Percent of a batch that may fail before later batches are skipped (default 100)",
    "break-lock": "Take the host lock even if another run holds it (that run stops at its next request)",
}
SELECT = ("host", "group", "all", "inventory", "accept_new_host_key", "ask_become_pass", "forks")
WHERE = SELECT[:4]
FLEET = SELECT + ("json", "serial", "max_fail", "break_lock", "quiet")
_DEFAULTS = {f.name: f.default for f in fields(Selection)}
# The whole-number options and their bounds.  Invoke casts a value to its default's type, and an
# int() that fails ends in its parser's traceback: they reach the task as text, read by `whole`.
NUMBERS = {"forks": (1, None), "serial": (0, None), "max_fail": (0, 100)}


def fleet_task(*shared: str, name: str | None = None, shorts: bool = True, optional: tuple = (), **own_help: str):
    """An invoke task whose body is `body(c, sel: Selection, **own options)`: the `shared`
    options are declared once here (with their help) and arrive together in `sel`.  `shorts`
    False: long options only; `optional`: options whose value may be left out (then True)."""
    def wrap(body: Callable) -> Any:
        params = list(inspect.signature(body).parameters.values())
        own = params[2:]
        extra = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   default=str(_DEFAULTS[n]) if n in NUMBERS else _DEFAULTS[n]) for n in shared]

        @one_line
        def wrapper(c, **kwargs):
            # (--help where a value goes, `inv patch --help`, `--host --help`: usage.help_as_a_value)
            given = {n: kwargs.pop(n) for n in shared if n in kwargs}
            sel = Selection(**{n: whole(v, "--" + n.replace("_", "-"), *NUMBERS[n]) if n in NUMBERS else v
                               for n, v in given.items()}, ways=tuple(w for w in Selection.ways if w in shared))
            if sel.json:  # written at the end: a typo is said before any host changes
                outfile.check(sel.json, "--json")
            with again.chosen(sel.inventory):  # the hints a task words repeat its --inventory
                return body(c, sel, **kwargs)
        wrapper.__name__, wrapper.__doc__ = body.__name__, body.__doc__
        # Which hosts comes first, so -h, -g, -a, -i mean the same in every task; short flags go in order.
        where = [p for p in extra if p.name in WHERE]
        needed = [p for p in own if p.default is inspect.Parameter.empty]
        wrapper.__signature__ = inspect.Signature([params[0], *needed, *where, *(p for p in own if p not in needed),
                                                   *(p for p in extra if p not in where)])
        helps = {n.replace("_", "-"): HELP[n.replace("_", "-")] for n in shared}
        return task(wrapper, name=name or body.__name__.replace("_", "-"), help={**helps, **own_help},
                    auto_shortflags=shorts, klass=_Task, optional=list(optional))
    return wrap


# Options that trust or take over something are spelt out: never one mistyped letter.  So is one
# whose letter means a selection option in the other tasks (-a: --all).
LONG_ONLY = ("accept_new_host_key", "break_lock", "apply", "alertmanager")


class _Task(Task):
    """Invoke gives an option the first free character of its name as its short flag, which can
    be "-" (shown as "--", which no one can type): such an option goes without, as LONG_ONLY do."""

    def arg_opts(self, name, default, taken_names):
        out = super().arg_opts(name, default, taken_names)
        out["names"] = [n for n in out["names"] if len(n) > 1 or (n.isalnum() and name not in LONG_ONLY)]
        return out


def _same_batch(hosts: list[inv.Host], serial: int, forks: int) -> None:
    """The nodes of a service across hosts start together: never in different rolling batches,
    and never more of them than run at once."""
    where = {h.name: i // serial for i, h in enumerate(hosts)} if serial else {}
    for h in hosts:
        for svc in h.get("services") or []:
            nodes = multinode.spans(svc)
            if serial and len({where.get(n) for n in nodes}) > 1:
                raise UsageError(f"{svc['name']} runs on {', '.join(nodes)}, which --serial {serial} would put in "
                                 f"different batches: its nodes start together")
            if len(nodes) > forks:
                raise UsageError(f"{svc['name']} runs on {len(nodes)} nodes, more than --forks {forks} run at once: "
                                 f"its nodes start together")


def select(sel: Selection, vocabulary: dict, services: list[str] | None = None) -> list[inv.Host]:
    """The selected hosts: a task reaches every host of an inventory only with --all (as Kamal and
    Capistrano ask for a destination).  `vocabulary`: the host vars an inventory may hold
    (roles.VOCABULARY); `services`: names every selected host must define."""
    inventory = inv.load(inventory_path(sel.inventory), vocabulary)
    if not (sel.host or sel.group or sel.all) and sel.ways == ("host",):
        raise UsageError("choose the host: --host NAME")
    if not (sel.host or sel.group or sel.all):
        groups = ", ".join(sorted(g for g in inventory.groups if g not in ("all", "ungrouped")))
        raise UsageError("choose the hosts: --host NAME, --group NAME or --all"
                         + (f" (groups: {groups})" if groups else ""))
    if sel.all and (sel.host or sel.group):
        raise UsageError("give --all, or --host/--group, not both")
    hosts = inventory.select(sel.host, sel.group)
    # A service across hosts is started, stopped and rolled back on all its nodes together.
    chosen, ordered, todo = {h.name for h in hosts}, [], list(hosts)
    while todo:  # a node brought in goes right after the host that brought it, and brings its own
        h = todo.pop(0)
        ordered.append(h)
        for svc in h.get("services") or []:
            if services and svc["name"] not in services:
                continue
            extra = [n for n in multinode.spans(svc) if n not in chosen]
            if extra:
                print(f"{svc['name']} spans {', '.join(multinode.spans(svc))}: {', '.join(extra)} included",
                      file=sys.stderr)
                todo[:0] = [inventory.hosts[n] for n in extra]
                chosen.update(extra)
    hosts = ordered
    for h in hosts:
        names = [s["name"] for s in h.get("services") or []]
        missing = [s for s in services or [] if s not in names]
        if missing:
            raise UsageError(f"{h.name}: no service {missing[0]!r} (known: {', '.join(names) or 'none'})")
    return hosts


def play(body: Callable[[HostRun], Any], roles: list, sel: Selection, *, vocabulary: dict, task: str = "run",
         services: list[str] | None = None, run_checks: bool = True, stream=None, quiet: bool | None = None,
         exit_on_failure: bool = True, refuse: Callable[[list[inv.Host]], None] | None = None,
         show: Callable[[list[HostReport]], None] | None = None, read_only: bool = False) -> list[HostReport]:
    """Select hosts (in `vocabulary`), run `body` on each, print the recap, exit non-zero on any failure.
    Each report's `result` is what `body` returned for that host.  `refuse(hosts)` raises
    UsageError for what the task must not do to them, before any connection.  `show(reports)`
    prints what the task found (a table) before the recap, so the recap comes last, as deploy's.
    `read_only` (and --check): the task changes no host, and its recap says what it looked at."""
    read_only = read_only or sel.check
    try:
        hosts = select(sel, vocabulary, services)
        if not hosts:
            raise UsageError("no hosts selected")
        if refuse:
            refuse(hosts)
        _same_batch(hosts, sel.serial, sel.forks)
        if sel.ask_become_pass:
            become.ask_password()
        quiet = sel.quiet if quiet is None else quiet
        out = Reporter(Redactor(hosts), show_diff=sel.diff or sel.check, verbose=not quiet, stream=stream)
        opts = Options(check=sel.check, diff=sel.diff, accept_new=sel.accept_new_host_key, forks=sel.forks,
                       serial=sel.serial, max_fail=float(sel.max_fail), break_lock=sel.break_lock, task=task,
                       run_checks=run_checks, verify_weights=sel.verify_weights,
                       provenance=provenance.read(inventory_path(sel.inventory)) if task in RECORDS_RELEASES else None)
        reports = run_hosts(hosts, body, roles, opts, out)
    except SpecopsError as e:
        exit_with(e)
    except KeyboardInterrupt as e:
        print("interrupted", file=sys.stderr)
        if isinstance(e, Interrupted):  # the hosts' state as far as known, --json too
            try:
                recap(e.reports, out, sel.json, cut=True, read_only=read_only)
            except SpecopsError as unwritten:  # said, and the run still ends as Ctrl-C ends it
                print(f"error: {unwritten}", file=sys.stderr)
        raise Exit(code=130)
    if show:
        show(reports)
        sys.stdout.flush()  # the table (stdout) before the recap (stderr) on one terminal
    code = recap(reports, out, sel.json, read_only=read_only)
    if code and exit_on_failure:
        raise Exit(code=code)
    return reports


def exit_with(e: SpecopsError) -> NoReturn:
    """A run that ends before any host's recap: one line, and the error's exit code."""
    print(f"error: {e}", file=sys.stderr)
    raise Exit(code=e.exit_code)


def one_line(body: Callable) -> Callable:
    """A task's body whose SpecopsError, wherever in it (a selection read outside `play`, an option
    checked by the body), ends the run as `exit_with` says, never in a traceback."""
    @functools.wraps(body)
    def said(*args, **kwargs):
        try:
            return body(*args, **kwargs)
        except SpecopsError as e:
            exit_with(e)
    return said


def job_after_dashes(example: str) -> str:
    """The command line after `--`: one argument is a shell command line (quoted as a whole);
    several are words that stay words.  None given is a one-line usage error."""
    words = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    if not words:
        exit_with(UsageError(f"give the job after --, e.g. {example}"))
    return words[0] if len(words) == 1 else shlex.join(words)


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def whole(text, option: str, low: int = 0, high: int | None = None) -> int:
    """An option's whole number within [low, high]; anything else is a one-line usage error."""
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        raise UsageError(f"{option}: give a whole number " + (f"from {low} to {high}" if high is not None
                                                              else f"of at least {low}") + f" (got {text!r})")
    return value


def positive_ints(text: str, option: str) -> list[int]:
    """"1,8,32" → [1, 8, 32]; anything else is a one-line usage error."""
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UsageError(f"{option}: give positive whole numbers, comma-separated (got {text!r})")
    return values
