"""Every op's plan as data, the pyinfra way: one file per op in tests/ops/ (`op`, then `cases`, each
with the op's `args`, the probe's `facts`, the run's `ctx`), and what the plan must give: its
`summary` and its `actions` (each a subset of an action's fields, `kind` included, in order), or
the PlanError it refuses with (`error`).  A check id named CHECK in the facts stands for the op's
own (Command's is a hash of its command).  No fleet."""
from pathlib import Path

import pytest
import yaml

from specops import ops, protocol
from specops.ops import Context, Facts, PlanError
from specops.ops.handlers import Handler
from specops.ops.systemd import Timer

OPS = {**{name: getattr(ops, name) for name in ops.__all__}, "Timer": Timer}
CASES = [(path.stem, case) for path in sorted((Path(__file__).parent / "ops").glob("*.yml"))
         for case in yaml.safe_load(path.read_text())["cases"]]


def _op_of(stem: str):
    return OPS[yaml.safe_load((Path(__file__).parent / "ops" / f"{stem}.yml").read_text())["op"]]


def _facts(op, given: dict) -> Facts:
    data = {"files": {}, "units": {}, "venvs": {}, "checks": {}, **given}
    if "CHECK" in data["checks"]:
        data["checks"] = {op.check_id: data["checks"].pop("CHECK"), **data["checks"]}
    return Facts(data)


def _ctx(given: dict) -> Context:
    notified = [Handler(*h.split(" ", 1)) for h in given.get("notified", [])]
    return Context("h", False, notified=notified, release_dir=given.get("release_dir"))


@pytest.mark.parametrize("stem, case", CASES, ids=[f"{stem}: {case['name']}" for stem, case in CASES])
def test_an_ops_plan(stem, case):
    op = _op_of(stem)(**case["args"])
    facts, ctx = _facts(op, case.get("facts") or {}), _ctx(case.get("ctx") or {})
    if "error" in case:
        with pytest.raises(PlanError) as refused:
            op.plan(facts, ctx)
        assert str(refused.value) == case["error"]
        return
    change = op.plan(facts, ctx)
    assert change.summary == case["summary"]
    got = [protocol.encode(a) for a in change.actions]
    assert len(got) == len(case["actions"]), got
    for action, want in zip(got, case["actions"]):
        assert {k: action.get(k) for k in want} == want, action
    assert change.changed == bool(change.actions or change.notify)


def test_every_op_file_names_an_op_and_every_case_says_what_it_expects():
    assert CASES and all(_op_of(stem) for stem, _ in CASES)
    assert all(("error" in c) != ("summary" in c and "actions" in c) for _, c in CASES)
