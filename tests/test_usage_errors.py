"""Issue 50: every task, given each usage error it can be given (no inventory, an unknown host, a
required option left out, an unknown option, a bad value for an option that is checked before
any connection), says one line on stderr, names the mistake and exits 2: never a traceback, never
invoke's exit 1, never a connection.  Each task is run as a user runs it: `inv` in a process of
its own, in a directory of its own, with no terminal.  No fleet."""
import copy
import os
import subprocess
import sys

import pytest

import tasks
from support import ROOT
from support.inventories import Listener, write

# sandbox.up boots hosts and sandbox.down removes them; sandbox.traffic sends requests: were a
# check missed, the test must not do any of it.  What each task would do is replaced by an exit
# 99; all else (invoke's parser, the tasks' own checks) is the real `inv`.
GUARD = """import sys
sys.path.insert(0, sys.argv.pop(1))
import sandbox.tasks, sandbox.traffic
def acted(*args, **kwargs):
    sys.exit("the task went past its checks")
sandbox.tasks.up = sandbox.tasks.down = sandbox.traffic.traffic = acted
from invoke.main import program
program.run()
"""

# What each task needs besides a selection to get as far as its own checks; the job after `--`
# goes last.
NEEDS = {"patch": ["srt/models/llama.py", "--fetch"], "monitoring": ["--out", "{tmp}/prom"]}
LAST = {"gpu-window": ["--", "true"]}
# Required besides the selection: the words left out, and what must name them.
REQUIRED = {"patch": [(["srt/models/llama.py"], "FILE"), (["--fetch"], "--fetch")],
            "monitoring": [(["--out", "{tmp}/prom"], "OUT")], "gpu-window": [(["--", "true"], "the job after --")]}
# A value each option refuses before any connection (what must name it: the option or the value).
BAD = {
    "group": "nosuch", "service": "nosuch", "forks": "x", "serial": "-1", "max_fail": "150", "requests": "x",
    "max_new_tokens": "0", "concurrency": "1,x", "budget": "x", "at": "x", "itl_p99_ms": "x", "seed": "x",
    "traffic": "x", "traffic_wait": "x", "prompts": "/nonexistent/prompts.json", "scrape_interval": "soon",
    "alertmanager": "nohost", "hosts": "x", "flavour": "nosuch", "accept_rate": "2", "seconds": "x",
    "clients": "0",
}
# Values refused besides BAD's, each said with the option's bounds: sandbox.up boots at most 62
# hosts (the sandbox's /24), said before anything is touched, and makes no list of a huge count.
MORE_BAD = {"sandbox.up": [("--hosts", "0"), ("--hosts", "63"), ("--hosts", "10" * 20)]}
# Paths a run writes at its end, with the words each needs besides: refused before any
# connection when no file can be written there (its directory missing, the path a directory),
# never found once the run is over and the hosts changed.  (monitoring's OUT is a directory it
# makes, with checks of its own: tests/test_monitoring_out.py.)
WRITTEN = {"json": [], "out": [], "fetch_sample": ["--traffic", "5"]}
# Options any text goes for before connecting: what the host holds (a release stamp), the
# selection's own (each has its cases), and inv patch's FILE and --edited, which its own checks
# read (tests/test_patches.py).
FREE = {"host", "inventory", "to", "file", "edited"}


def _arguments(name: str) -> dict:
    return {a.name: a for a in copy.deepcopy(tasks.ns[name]).get_arguments()}


def _cases() -> list:
    """(argv, the words one of which the line must hold) for every task and usage error it can be given."""
    out = []
    for name in sorted(tasks.ns.task_names):
        args = _arguments(name)
        inv = ["-i", "{tmp}/inv"] if "inventory" in args else []
        sel = ["--host", "a"] if "host" in args else []

        def case(wrong, says, *more, inventory=inv, selection=sel, drop=()):
            words = [name, *inventory, *selection, *NEEDS.get(name, []), *more, *LAST.get(name, [])]
            out.append(pytest.param([w for w in words if w not in drop], says, id=f"{name}: {wrong}"))
        case("unknown option", "--no-such-option", "--no-such-option")
        # One not on the line already: invoke takes a flag given twice, bare the second time, as
        # given the first time's value.
        valued = next((f"--{a.names[0]}" for a in args.values()
                       if a.kind is not bool and not a.positional and a.name not in ("host", "inventory")), None)
        if valued:
            case("no value", f"{valued} needs a value", valued)
        if inv:
            case("no inventory", "{tmp}/missing", inventory=["-i", "{tmp}/missing"])
        if sel:
            case("unknown host", "nosuch", selection=["--host", "nosuch"])
            # only the options the task has (gpu-window: --host alone)
            case("no selection", "choose the hosts: --host NAME, --group NAME or --all" if "group" in args
                 else "choose the host: --host NAME", selection=[])
        for flag, value in MORE_BAD.get(name, []):
            case(f"{flag} {value}", f"{flag}: give a whole number from 1 to 62 (got '{value}')", flag, value)
        for left, says in REQUIRED.get(name, []):
            case(f"no {says}", says, drop=left)
        for a in args.values():
            if a.kind is not bool and a.name in BAD:
                flag, value = f"--{a.names[0]}", BAD[a.name]
                case(f"bad {flag}", f"{flag}|{value}", flag, value, selection=sel if a.name != "group" else [])
            if a.name in WRITTEN and not a.positional:
                flag = f"--{a.names[0]}"
                case(f"{flag} in no directory", f"{flag} {{tmp}}/nodir/x", *WRITTEN[a.name], flag, "{tmp}/nodir/x")
                case(f"{flag} a directory", f"{flag} {{tmp}}/inv: a directory", *WRITTEN[a.name], flag, "{tmp}/inv")
    return out


def test_every_option_is_given_a_bad_value_or_takes_any_text():
    """A new option is classified here: the cases below then give it its bad value."""
    unclassified = {(n, a.name) for n in tasks.ns.task_names for a in _arguments(n).values()
                    if a.kind is not bool and a.name not in BAD and a.name not in FREE and a.name not in WRITTEN}
    assert unclassified == set()


@pytest.fixture(scope="module")
def fleet_of_one(tmp_path_factory):
    """An inventory whose one host, `a`, is a loopback listener that counts connection attempts."""
    listener = Listener()
    tmp = tmp_path_factory.mktemp("usage")
    write(tmp / "inv", {"hosts.yml": f"""
        all:
          children:
            g:
              hosts:
                a: {{address: 127.0.0.1, ssh_port: {listener.port}, connect_timeout: 2}}
        """})
    yield tmp, listener
    listener.close()


def _inv(tmp, argv: list) -> subprocess.CompletedProcess:
    """`inv ARGV` (the GUARD's) in tmp, with no inventory from the environment and no terminal."""
    argv = [w.replace("{tmp}", str(tmp)) for w in argv]
    env = {k: v for k, v in os.environ.items() if k != "SPECOPS_INVENTORY"}
    return subprocess.run([sys.executable, "-c", GUARD, str(ROOT), "-r", str(ROOT), *argv], cwd=tmp,
                          capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("argv, says", _cases())
def test_a_usage_error_is_one_line_and_exit_2(fleet_of_one, argv, says):
    tmp, listener = fleet_of_one
    res = _inv(tmp, argv)
    lines = res.stderr.strip().splitlines()
    assert (res.returncode, len(lines), res.stdout) == (2, 1, ""), res.stderr[-3000:]
    assert "Traceback" not in res.stderr, lines
    assert any(w.replace("{tmp}", str(tmp)) in lines[0] for w in says.split("|")), lines
    assert listener.accepted == 0


def _valued(name: str) -> str | None:
    """The task's first option that takes a value, as typed; None when it has none."""
    return next((f"--{a.names[0]}" for a in _arguments(name).values() if a.kind is not bool and not a.positional),
                None)


@pytest.mark.parametrize("name", sorted(n for n in tasks.ns.task_names if _valued(n)))
def test_help_where_an_option_value_goes_shows_the_tasks_help(fleet_of_one, name):
    """Issue 50, 10: --help works in every position.  Invoke gives an option the next word as its
    value, whatever it is: `--host --help` was an unknown host '--help', `-i --help` an inventory
    not found.  Every task, its first option that takes a value, given --help: the task's help,
    exit 0, as `inv --help TASK` prints it."""
    tmp, listener = fleet_of_one
    flag = _valued(name)
    shown = _inv(tmp, ["--help", name])
    assert shown.returncode == 0 and "Docstring:" in shown.stdout, shown.stderr
    res = _inv(tmp, [name, flag, "--help", *LAST.get(name, [])])
    assert (res.returncode, res.stdout, res.stderr) == (0, shown.stdout, ""), (flag, res.stderr[-2000:])
    assert listener.accepted == 0


@pytest.mark.parametrize("argv", [["nosuch"], ["--help", "nosuch"], ["deploy", "--host", "a", "nosuch"]],
                         ids=["a task", "--help TASK", "after a task"])
def test_a_task_that_does_not_exist_is_one_line_and_exit_2(fleet_of_one, argv):
    """invoke's parser finds a word that is no task (usage.said), and `inv --help TASK` finds it
    after the parse (its cleanup step, which usage.install wraps too): one line, exit 2."""
    tmp, listener = fleet_of_one
    res = _inv(tmp, argv if argv[0] != "deploy" else [*argv[:1], "-i", "{tmp}/inv", *argv[1:]])
    said = ("inv deploy: 'nosuch' is none of its options, nor a task (inv --help deploy lists its options)"
            if argv[0] == "deploy" else "no task 'nosuch' (inv --list lists them)")
    assert (res.returncode, res.stdout, res.stderr) == (2, "", f"error: {said}\n")
    assert listener.accepted == 0
