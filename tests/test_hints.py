"""Issue 50: a hint that names a command repeats the options that chose the inventory, and names
the host it is about, so that pasted it runs against the same ones (`carry it onto sglang 0.5.24
with: inv patch --host sandbox ...` dropped the user's --inventory: pasted, it read another one).
Each hint is made as a run with --inventory makes it, and each command in it goes through
invoke's own parser, as `inv` reads it.  No fleet."""
import ast
import functools
import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from invoke import Context, Exit
from invoke.parser import Parser, ParserContext

import tasks
from support import ROOT
from specops import again
from specops.errors import SpecopsError
from specops.run import HostRun

INVENTORY = "/srv/my fleet/inventory"  # a space: the shell must read it as one word
HOST = "box"


@pytest.fixture
def chosen():
    with again.chosen(INVENTORY):
        yield


def commands(text: str) -> list[str]:
    """The commands a message names: each in backquotes, or one that ends its line."""
    quoted = re.findall(r"`(inv [^`]*)`", text)
    rest = re.sub(r"`inv [^`]*`", "", text)
    return quoted + re.findall(r"(?:^|[\s(])(inv [a-z].*)$", rest, re.M)


def pasted(text: str, task: str | None, host: str | None = HOST) -> None:
    """Every command in `text` is `task` (None: any) run against INVENTORY and `host`, as invoke
    parses it."""
    found = commands(text)
    assert found, text
    for line in found:
        words = shlex.split(line)
        ctx = Parser(initial=ParserContext(), contexts=tasks.ns.to_contexts()).parse_argv(words[1:])[1]
        assert (words[0], ctx.name if task else None, ctx.args["inventory"].value) == ("inv", task, INVENTORY), line
        assert ctx.args["host"].value == host, line


def _run(**kwargs) -> SimpleNamespace:
    """A host's run as the flows read it: its host, HostRun's own `hint`, and `kwargs`."""
    run = SimpleNamespace(host=SimpleNamespace(name=HOST, get=lambda key: None), **kwargs)
    run.hint = functools.partial(HostRun.hint, run)
    return run


def test_a_command_is_retyped_with_the_inventory_given_and_without_one(chosen):
    pasted(again.command("deploy", "--check", host=HOST), "deploy")
    with again.chosen(None):  # none given: $SPECOPS_INVENTORY or inventory/ choose it again, as they did
        assert again.command("deploy", host=HOST) == "inv deploy --host box"
    assert again.command("status", host=again.Filled("{{ $labels.host }}")).endswith("--host {{ $labels.host }}")


def test_deploy_s_hint_for_a_patch_that_no_longer_applies(chosen, monkeypatch):
    from specops.sglang import patches, patchfile, patchlint

    def refuse(*args):
        raise patchfile.HunkError("hunk 1 of 1 does not apply")
    monkeypatch.setattr(patchlint, "apply_checked", refuse)
    with pytest.raises(patchfile.HunkError) as e:
        patches.applied(SimpleNamespace(name=HOST), "diff", "upstream", "srt/models/llama.py", "0.5.24")
    pasted(str(e.value), "patch")


def test_inv_patch_s_hint_after_a_conflicting_rebase(chosen, monkeypatch, tmp_path):
    from specops.flows import patching
    monkeypatch.setattr(patching, "upstream", lambda run, rel: ("new", "0.5.24", "b" * 64))
    monkeypatch.setattr(patching, "_base_upstream", lambda run, version, rel, exclude: ("old", "0.5.23", "a" * 64))
    monkeypatch.setattr(patching.kinds, "venv_of", lambda host: "/v")
    monkeypatch.setattr(patching.patchfile, "base_of", lambda diff: None)
    monkeypatch.setattr(patching.patchfile, "rebase", lambda *args: ("merged", ["hunk 1: both changed"]))
    (tmp_path / "llama.py.patch").write_text("diff")
    with pytest.raises(SpecopsError) as e:
        patching.rebase(_run(), tmp_path / "llama.py.patch", "srt/models/llama.py")
    pasted(str(e.value), "patch")


def test_the_tune_hint_of_status_and_of_the_alerts(chosen, tmp_path):
    from roles import VOCABULARY
    from specops import inventory
    from specops.fleetwide import alerts, payoff
    from specops.flows import status
    pasted(payoff.remedy(HOST), "spec-tune")
    line = status._runs_lines(HOST, {"service": "sglang", "runs": {"venv": "/a", "inventory_venv": "/b"}})[0]
    pasted(line, "deploy")
    (tmp_path / "hosts.yml").write_text(f"all: {{hosts: {{{HOST}: {{address: 127.0.0.1, monitoring: true}}}}}}\n")
    rules = alerts.rules(inventory.load(str(tmp_path), VOCABULARY))["groups"][0]["rules"]
    notes = [r["annotations"] for r in rules if "alert" in r]
    said = [n["run"] for n in notes] + [n["description"] for n in notes if "`inv " in n["description"]]
    assert len(said) > len(notes)  # every alert's `run`, and a description's command
    for text in said:
        pasted(text.replace("{{ $labels.host }}", HOST), None)  # as Alertmanager fills the template in


def test_a_deploy_s_hints_when_its_undo_fails_or_its_outcome_is_not_known(chosen, monkeypatch):
    from specops.flows import pipeline
    run = _run(applying=True, quick=None, previous=lambda: {}, say=lambda text: None, enabled=lambda: {},
               running=None, restarting=True, concerned=set())
    with pytest.raises(SpecopsError) as e:
        pipeline.failed(run, "/r/1", SpecopsError("the connection was lost"))
    pasted(str(e.value), "status")

    def lost(*args, **kwargs):
        raise SpecopsError("the connection was lost again")
    monkeypatch.setattr(pipeline.kinds, "unit_refs", lambda host, quick: {})
    run.call = lost
    with pytest.raises(SpecopsError) as e:
        pipeline.undo(run, "/r/1", SpecopsError("verify failed"))
    pasted(str(e.value), "rollback")


def test_stop_s_hints_of_what_a_reboot_does(chosen, monkeypatch):
    from specops import protocol
    from specops.flows import pipeline, rolling
    monkeypatch.setattr(rolling, "out_of_routers", lambda run, body, names=None, back=True: body())
    said = []
    run = _run(probe=lambda *a, **k: None, say=said.append)
    for enabled, task in (("enabled", "stop"), ("disabled", "deploy")):
        monkeypatch.setattr(pipeline, "stop", lambda run, names, disable: protocol.StopResult(
            services=[protocol.StopReport("sglang", 1.0, enabled=enabled)]))
        pipeline.stop_task(run)
        pasted(said.pop(), task)


def test_spec_tune_s_hints(chosen):
    from specops.flows import tuning_record
    from specops.sglang import tuning
    from specops.sglang.tuning import Settings
    flat = {Settings(1, 1, 2): 1.50, Settings(3, 1, 4): 1.52, Settings(5, 4, 16): 1.55}
    pasted(tuning.draft_limit(flat, HOST), "deploy")
    # a group's vars: G is the group the user writes them in
    pasted("\n".join(tuning_record.inventory_lines(HOST, "sglang", {"k": 1})), "deploy", host=None)


def test_gpu_window_s_example_is_the_user_s_command(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["inv", "gpu-window", "-i", INVENTORY, "--host", HOST])
    with pytest.raises(Exit):
        tasks.gpu_window(Context(), host=HOST, inventory=INVENTORY)
    pasted(capsys.readouterr().err, "gpu-window")
    assert again.command("status") == "inv status"  # the task's inventory ends with it


TASK = re.compile(r"\binv (%s)\b" % "|".join(re.escape(n) for n in tasks.ns.task_names if "." not in n))
PROSE = {"inv patch reads one host's SGLang: give --host"}  # the task named, not a command to run


def _docstrings(tree) -> set:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def test_every_hint_is_made_by_again_command():
    """No message of specops's or of a task's body names `inv TASK` by hand (docstrings and the
    tasks' help name them as words): each goes through the one place that repeats the options."""
    by_hand = []
    for path in [*sorted((ROOT / "specops").rglob("*.py")), ROOT / "tasks.py"]:
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree) | {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                                    for d in f.decorator_list for n in ast.walk(d)}
        by_hand += [f"{Path(path).relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
                    and TASK.search(n.value) and n.value not in PROSE]
    assert by_hand == []


def test_the_agent_names_the_releases_it_can_roll_back_to_not_a_command(monkeypatch):
    """The host knows not how the user chose it, to word `inv releases` for them."""
    from specops import protocol
    from specops.agent import rollback
    from specops.agent.host import ActionError
    monkeypatch.setattr(rollback, "manifests", lambda: [{"stamp": "1", "status": "deployed"},
                                                        {"stamp": "2", "status": "rolled_back"}])
    monkeypatch.setattr(rollback, "current", lambda: "1")
    with pytest.raises(ActionError, match=r"^no deployed release 9 \(deployed: 1\)$"):
        rollback.rollback(protocol.Rollback(to="9"))
