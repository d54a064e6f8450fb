"""The GPU stack's plan without a fleet: what its import check says it checks."""
import json

from specops import inventory
from specops.ops import Context, Facts, Venv
from roles import gpu_stack
from roles import VOCABULARY


def plan(tmp_path, pins: dict):
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {"venv": "/v", **pins}}}}))
    host = inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts["box"]
    (op,) = [o for o in gpu_stack.ops(host) if isinstance(o, gpu_stack.PythonPackages)]
    facts = Facts({"venvs": {"/v": {"exists": True, "packages": {}}}, "gpu": {"present": False}})
    return op.plan(facts, Context("box", False))


def test_the_import_check_names_what_it_imports(tmp_path):
    """Issue 24 (a new user's rough edge): 'import torch, fla, sglang' showed with only sglang
    pinned."""
    only = plan(tmp_path, {"sglang": {"version": "0.5.23"}})
    assert [a.desc for a in only.actions] == ["pip install sglang==0.5.23", "import sglang"]
    both = plan(tmp_path, {"sglang": {"version": "0.5.23"}, "fla": {"version": "0.3.2"}})
    assert both.actions[-1].desc == "import fla, sglang"


def test_a_venv_of_the_users_is_no_stack_and_is_taken_as_it_is(tmp_path):
    """A `venv:` of the user's that exists is ok whatever the host's stacks are (it is none)."""
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"box": {"venv": "/v",
                                                                              "sglang": {"version": "0.5.23"}}}}}))
    host = inventory.load(tmp_path / "hosts.yml", VOCABULARY).hosts["box"]
    (op,) = [o for o in gpu_stack.ops(host) if isinstance(o, Venv)]
    facts = Facts({"venvs": {"/v": {"exists": True, "version": "3.11.2", "packages": {}}}, "stacks": []})
    assert op.plan(facts, Context("box", False)).actions == []
