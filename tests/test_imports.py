"""What `import tasks` costs every `inv` run, a no-op deploy's among them.  No fleet."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Imported only by the tasks, roles' plans or inventories that use them: a deploy that reads no
# patch, no wheel and no INI inventory, and benches, tunes and reports nothing, never does.
NOT_AT_START = (
    "whatthepatch", "merge3", "pyflakes",  # a patch read, linted or applied
    "jinja2",  # a template rendered
    "urllib.request", "http.client", "html",  # a wheel's files read; the report's page
    "specops.inventory.ansible",  # an INI inventory
    "specops.flows.tuning", "specops.flows.specbench", "specops.flows.gate", "specops.flows.patching",
    "specops.fleetwide.report", "specops.fleetwide.prometheus", "specops.output.releases",
)


def test_importing_tasks_leaves_out_what_only_some_tasks_need():
    """In a fresh interpreter (this one has imported everything by now): tasks.py names every flow,
    and each is imported when a task first uses it."""
    res = subprocess.run([sys.executable, "-c", "import sys, tasks; print(' '.join(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    assert "roles" in loaded and "specops.cli" in loaded  # the roles make the inventory's vocabulary
    assert sorted(m for m in NOT_AT_START if m in loaded) == []


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


LAZY = ("lazy", "import_module")  # calls that import the module their string names


def import_graph() -> dict[str, set[str]]:
    """Module → the project's modules it imports, at its top, inside a function, or by name through
    LAZY alike (a function-level import holds a circle shut, it does not open it).  `from pkg import name`
    points at pkg.name when that is a module, else at pkg."""
    paths = [p for d in ("specops", "roles", "sandbox") for p in (ROOT / d).rglob("*.py")
             if "sglang_sim" not in p.parts] + [ROOT / "tasks.py"]
    modules = {_module(p): p for p in paths}

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in LAZY \
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                targets.add(known(node.args[0].value))  # lazy("specops.flows.gate"), import_module("...")
            elif isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets |= {known(f"{base}.{a.name}") if f"{base}.{a.name}" in modules else known(base)
                            for a in node.names}
        graph[name] = targets - {"", name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on.discard(group[-1])
            if len(group) > 1:
                out.append(sorted(group))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_round_a_circle():
    assert circles(import_graph()) == []


def test_a_circle_is_seen_however_it_is_held_shut():
    """The reader above, on a graph with one circle and one chain."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_engine_imports_no_role_and_nothing_of_the_sandbox():
    """specops/ is the engine: the roles (the application) and the sandbox (a test fleet) build on
    it, never the other way; tasks.py hands the roles' vocabulary to it."""
    wrong = sorted((m, t) for m, targets in import_graph().items() if m.startswith("specops")
                   for t in targets if t.split(".")[0] in ("roles", "sandbox", "tasks"))
    assert wrong == []


CODE = ("specops", "roles", "sandbox")  # and tasks.py: what runs; the tests and bench/ are read, not run on hosts
MAX_LINES, MAX_WIDTH = 300, 120


def _python_files(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts)


# One chain of tests on one upgraded host (its releases and stacks carry from test to test):
# split, each half would upgrade a host of its own again, minutes of fleet time.
LONG_ON_PURPOSE = {"tests/test_upgrade_fleet.py"}


def test_every_module_does_a_job_small_enough_to_hold_in_the_head():
    """No module over 300 lines: the code's, the tests', the benchmarks' (but LONG_ON_PURPOSE)."""
    long = {str(p.relative_to(ROOT)): n for p in [*_python_files(*CODE, "tests", "bench"), ROOT / "tasks.py"]
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) == LONG_ON_PURPOSE, long


def test_no_line_is_wider_than_120_characters():
    wide = [f"{p.relative_to(ROOT)}:{i}" for p in [*_python_files(*CODE, "tests", "bench"), ROOT / "tasks.py"]
            for i, line in enumerate(p.read_text().splitlines(), 1) if len(line) > MAX_WIDTH]
    assert wide == []


TOP = ("roles/", "sandbox/", "tasks.py")  # the layers outside specops/; the others are named inside it


def _layer(module: str) -> str:
    """The layer a module is drawn in: a package of specops/ (`flows/`), specops's own top-level
    modules together (`*.py`), or a top folder of the repository (TOP)."""
    parts = module.split(".")
    if parts[0] == "tasks":
        return "tasks.py"
    if parts[0] != "specops":
        return parts[0] + "/"
    return f"{parts[1]}/" if len(parts) > 1 and (ROOT / "specops" / parts[1]).is_dir() else "*.py"


def layer_arrows() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        for target in targets:
            if _layer(module) != _layer(target):
                out.setdefault(_layer(module), set()).add(_layer(target))
    return out


def test_the_architecture_page_draws_who_imports_whom_as_the_code_does():
    """docs/ARCHITECTURE.md's block under "Who imports whom" is the code's import graph between
    layers, arrow for arrow; and the packages of specops/ import one another without a circle."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("## Who imports whom", 1)[1].split("```", 2)[1]
    drawn = {left.strip(): {t.strip() for t in right.split(",")}
             for left, _, right in (line.partition("->") for line in block.splitlines() if "->" in line)}
    assert drawn == layer_arrows()
    packages = {k: {t for t in v if t.endswith("/") and t not in TOP}
                for k, v in layer_arrows().items() if k.endswith("/") and k not in TOP}
    assert circles(packages) == []
