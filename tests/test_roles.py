"""The roles as the engine sees them: each declares the host vars it reads and the roles it
follows; the inventory's vocabulary and the order of a task's roles come from those.  No fleet."""
import ast
import itertools
from pathlib import Path

import roles
from specops.inventory import schema

ROOT = Path(__file__).resolve().parent.parent


def test_a_task_runs_its_roles_in_one_order_however_they_are_listed():
    for task in (roles.DEPLOY, roles.BOOTSTRAP):
        for listing in itertools.islice(itertools.permutations(task), 0, None, 997):
            assert roles.ordered(listing) == task
    # what the GPUs refuse comes first, before a bare box gets its packages
    assert [r.NAME for r in roles.BOOTSTRAP] == ["gpu_fit", "system_packages", "patch_check", "models", "gpu_stack",
                                                 "model_patches", "draft_config", "sglang_service", "router_stack",
                                                 "router", "monitoring"]
    assert roles.DEPLOY == roles.BOOTSTRAP[:1] + roles.BOOTSTRAP[2:]


def test_roles_that_wait_on_each_other_are_refused():
    class A:
        NAME, AFTER = "a", ("b",)

    class B:
        NAME, AFTER = "b", ("a",)
    try:
        roles.ordered([A, B])
    except AssertionError as e:
        assert "roles wait on each other: a, b" in str(e)
    else:
        raise AssertionError("a cycle was ordered")


def test_every_role_declares_what_it_reads_and_follows_only_roles_that_exist():
    names = {r.NAME for r in roles.ALL}
    for role in roles.ALL:
        assert isinstance(role.VARS, dict) and set(role.AFTER) <= names - {role.NAME}, role.NAME
    vocabulary = roles.VOCABULARY
    assert set(vocabulary) == set(schema.ENGINE_VARS) | {k for r in roles.ALL for k in r.VARS}
    assert {"torch", "package_index", "patch_dir", "venv", "services", "address"} <= set(vocabulary)


def test_no_role_imports_another_role():
    for path in sorted((ROOT / "roles").glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("roles"), f"{path.name} imports {node.module}"
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("roles") for a in node.names), path.name
