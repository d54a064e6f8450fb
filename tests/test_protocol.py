"""The controller–agent protocol and the agent as it travels.  No fleet."""
import ast
import json
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from specops import layout, protocol
from specops.remote import shipping
from specops.agent import main as agent_main
from support.agentwire import frames

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("wire,pattern", [
    ({"kind": "frobnicate"}, "unknown request kind 'frobnicate'"),
    ({"files": []}, "unknown request kind None"),
    ({"kind": "unlock"}, "request unlock: missing field 'token'"),
    ({"kind": "unlock", "token": "t", "tokn": 1}, "request unlock: unexpected field 'tokn'"),
    ({"kind": "check", "actions": [{"kind": "write", "path": "/x"}]},
     r"request check.actions\[0\] \(write\): missing field 'data'"),
    ({"kind": "check", "actions": [{"kind": "rm-rf"}]}, "unknown action kind 'rm-rf'"),
    ({"kind": "verify", "services": [{"port": 1}]}, r"request verify.services\[0\]: missing field 'name'"),
    ({"kind": "apply", "actions": [{"kind": "rm-rf"}]}, "apply changes the host: it runs only for a run that holds"),
    (["apply"], "unknown request kind None"),
])
def test_the_agent_refuses_what_is_not_ours_in_one_line(wire, pattern):
    import re
    answer = agent_main.answer(json.dumps(wire))
    assert answer["ok"] is False and re.search(pattern, answer["error"]), answer
    assert "\n" not in answer["error"]


# What changes files, units, releases or the GPUs' users: the agent runs these only for the run that
# holds the host lock.  Router membership is changed from a worker's run (protocol/routing.py).
CHANGES_HOST = {"apply", "undo", "rollback", "stop", "start", "release_record", "perf_record", "baseline_start",
                "end_job", "peer_key", "peer_copy", "traffic_capture", "traffic_drop"}


@pytest.mark.parametrize("kind", sorted(CHANGES_HOST))
def test_a_request_that_changes_the_host_is_refused_without_the_lock_before_it_is_read(kind, tmp_path, monkeypatch):
    """Whatever the controller sends: no `lock` in its envelope, nothing runs (the handler is never
    imported: its fields are not even read)."""
    imported = []
    monkeypatch.setattr(agent_main, "handler", lambda kind: imported.append(kind))
    answer = agent_main.answer(json.dumps({"kind": kind}))
    assert answer == {"ok": False, "error": f"{kind} changes the host: it runs only for a run that holds the host lock"}
    for token in ("", None, 0, []):  # an empty token is no token
        assert agent_main.answer(json.dumps({"kind": kind, "lock": token})) == answer
    assert imported == []


def test_the_requests_that_need_the_lock_are_those_that_change_the_host():
    assert {k for k in protocol.REQUEST_KINDS if protocol.changes_host(k)} == CHANGES_HOST
    assert not protocol.changes_host(None) and not protocol.changes_host(["apply"])


def test_every_request_kind_has_one_handler_and_a_result_type():
    assert set(agent_main.HANDLERS) == set(protocol.REQUEST_KINDS)
    for kind in protocol.REQUEST_KINDS:
        cls = protocol.wire._REQUESTS[kind]
        assert cls.__doc__ and issubclass(cls.Result, protocol.Message) and cls.Result.__doc__, kind


def test_the_package_holds_what_importing_every_submodule_gave_it():
    """Its later submodules (protocol.LATER) loaded when first asked for: the same names, the same
    objects, as `from .x import *` of each in order gave the package."""
    code = ("import sys; from specops import protocol; before = set(sys.modules); protocol.load_all()\n"
            "space = {'__name__': 'specops.protocol', '__package__': 'specops.protocol'}\n"
            "for m in ('parts', 'actions', 'converge', 'lock', 'lifecycle', 'releases', 'peer', 'bench', 'routing',"
            " 'window', 'textfile', 'traffic'):\n"
            "    exec('from .%s import *' % m, space)\n"
            "mine = {k: v for k, v in vars(protocol).items() if k in space}\n"
            "print(sorted(set(space) - set(vars(protocol)) - {'__builtins__'}), mine == {k: space[k] for k in mine},"
            " sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    later = ["specops.protocol." + m for m in protocol.LATER]
    assert out.strip() == "[] True %s" % sorted(later)


def test_every_message_is_documented():
    protocol.load_all()
    for cls in protocol.wire._CLASSES.values():
        assert cls.__doc__, cls


SAMPLES = [
    protocol.Probe(files=["/etc/x", layout.pkg_key("/v", "sglang/x.py")], content={"/etc/x": "always"},
                   units=["sglang"], gpu=True, lock_acquire=protocol.Holder("me@here", 1, "deploy", "now", "tok")),
    protocol.Apply(actions=[protocol.Write(path="/x", data="eA=="), protocol.Restart(unit=protocol.UnitRef("s")),
                            protocol.DaemonReload(), protocol.Preflight("/py", "code", ["--a"], {"k": 1}, "s")]),
    protocol.Verify(services=[protocol.ServiceCheck(name="s", port=1, endpoints=protocol.Endpoints(ready="/r"))]),
    protocol.Stop(services=[protocol.UnitRef("s", grace=2, titles=["sglang::"])], others=["t"]),
    protocol.Rollback(to="20260101T000000.000000Z", services=[protocol.UnitRef("s")]),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_requests_survive_the_wire(msg):
    wire = json.loads(json.dumps(protocol.encode(msg, unlock="tok")))
    assert wire["kind"] == msg.KIND and wire["unlock"] == "tok"
    assert protocol.decode_request(wire) == msg


def test_results_are_decoded_and_agent_errors_raised():
    req = protocol.Stop(services=[protocol.UnitRef("s")])
    result = protocol.StopResult(services=[protocol.StopReport(name="s", seconds=1.0, killed=[
        protocol.Process(pid=7, title="sglang::scheduler_TP0", signal="SIGKILL")])], gpus={"0": None})
    assert protocol.decode_result(req, {"ok": True, "result": protocol.encode(result)}) == result
    with pytest.raises(protocol.AgentError, match="no release before"):
        protocol.decode_result(req, {"ok": False, "error": "no release before x"})
    with pytest.raises(protocol.ProtocolError, match="missing field 'services'"):
        protocol.decode_result(req, {"ok": True, "result": {}})


def _literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)) and not isinstance(node.value, bool):
            yield node.value


def test_each_shared_fact_is_defined_once():
    """The host paths, the env-file key and the default port appear as literals only in layout.py:
    the controller and the agent both import them from there."""
    facts = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, (str, int))}
    facts -= {"pkg:", 5}  # too short to mean anything on their own
    offenders = {}
    for path in [*ROOT.glob("specops/**/*.py"), *ROOT.glob("roles/*.py"), ROOT / "tasks.py"]:
        if path.name == "layout.py":
            continue
        literals = set(_literals(path))
        found = facts & literals
        found |= {f for f in facts if isinstance(f, str) and f.startswith("/")
                  and any(isinstance(lit, str) and f in lit for lit in literals)}
        if found:
            offenders[str(path.relative_to(ROOT))] = sorted(map(str, found))
    assert offenders == {}
    from specops.agent import lock, releases
    from specops.agent.services import asking
    assert lock.LOCK_DIR is layout.LOCK_DIR and releases.RELEASES is layout.RELEASES
    assert asking.API_KEY_ENV is layout.API_KEY_ENV


def test_the_engine_imports_no_role():
    code = ("import sys; import specops.flows.pipeline, specops.flows.verify, specops.flows.status, specops.run, "
            "specops.cli, specops.flows.facts; "
            "print(sorted(m for m in sys.modules if m == 'roles' or m.startswith('roles.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_agent_zip_is_deterministic_small_modules_and_python_38():
    data, sha = shipping.artifact()
    members = [*((f"specops/{m}", (shipping.HERE / m).read_bytes()) for m in shipping.MEMBERS),
               ("__main__.py", shipping.MAIN)]
    assert shipping._zip(members) == shipping._zip(members) == data  # built again, not read from the memo
    with zipfile.ZipFile(BytesIO(data)) as z:
        names = z.namelist()
        assert "__main__.py" in names and "specops/agent/main.py" in names and "specops/protocol/wire.py" in names
        for name in names:
            source = z.read(name).decode()
            ast.parse(source, name, feature_version=(3, 8))  # the oldest python3 the agent supports
            if name.startswith("specops/agent/"):
                assert source.count("\n") <= 300, f"{name} is {source.count(chr(10))} lines"
                assert ast.get_docstring(ast.parse(source)), f"{name} has no docstring saying what it owns"


def test_the_agent_runs_from_its_zip_with_the_standard_library_alone(tmp_path):
    """python3 -I -S, nothing on the path but the zip: every agent module imports."""
    data, _ = shipping.artifact()
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(data)
    mods = [n[:-3].replace("/", ".") for n in zipfile.ZipFile(pyz).namelist() if n.startswith("specops/agent/")]
    code = (f"import sys; sys.path.insert(0, {str(pyz)!r}); import "
            + ", ".join(m.removesuffix(".__init__") for m in mods)
            + "\nimport importlib\nfrom specops.agent.main import HANDLERS\n"
            "for module, function in HANDLERS.values():\n"  # every request kind's handler is there
            "    getattr(importlib.import_module('specops.agent.' + module), function)\n")
    res = subprocess.run(["python3", "-I", "-S", "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    requests = b"".join(shipping.frame(r) for r in (b'{"kind": "nope"}', b'{"kind": "unlock", "token": "x"}'))
    res = subprocess.run(["python3", "-I", "-S", str(pyz)], input=requests, capture_output=True)
    first, second = frames(res.stdout)
    assert first["ok"] is False and "unknown request kind 'nope'" in first["error"]
    assert second == {"ok": True, "result": {"released": False, "running": []}}  # one agent, requests answered in order


def test_the_agent_has_no_import_circle():
    """No agent module imports, at any depth and at any place in its code, one that imports it back
    (releases ↔ stage ↔ units, routing ↔ service_http were such circles)."""
    import ast
    agent = ROOT / "specops" / "agent"
    deps = {}
    for path in agent.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specops.agent"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps[name].add(full if (ROOT / full.replace(".", "/")).with_suffix(".py").exists()
                                   or (ROOT / full.replace(".", "/")).is_dir() else node.module)
    circles = set()

    def walk(start, node, path):
        for d in deps.get(node, ()):
            if d == start:
                circles.add(" -> ".join(path + [d]))
            elif d in deps and d not in path:
                walk(start, d, path + [d])
    for name in deps:
        walk(name, name, [name])
    assert circles == set()


def test_two_ops_wanting_files_of_different_wheels_in_one_probe_is_an_error_not_a_silent_drop():
    from specops.ops.base import merge_wants
    a = protocol.Probe(wheel_files={"dist": "sglang", "version": "0.5.23", "files": ["sglang/a.py"]})
    b = protocol.Probe(wheel_files={"dist": "sglang", "version": "0.5.24", "files": ["sglang/b.py"]})
    assert merge_wants([a, protocol.Probe(stacks=True), a]).wheel_files == a.wheel_files
    with pytest.raises(ValueError, match="two ops want files of different wheels"):
        merge_wants([a, b])
