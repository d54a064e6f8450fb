"""Roles: each a short checklist of ops built from a host's inventory vars.

Each role module has NAME, VARS (the host vars it reads, beside the engine's own in
specops/inventory/schema.py: together the inventory's VOCABULARY, which this package hands to
`inventory.load`), AFTER (the roles it must follow when they run too), optionally REPROBE, and
ops(host).  Which roles each task runs is said here, once.
"""
from specops.inventory.schema import ENGINE_VARS

from . import (draft_config, gpu_fit, gpu_stack, model_patches, models, monitoring, patch_check, router,
               router_stack, sglang_service, system_packages)

ALL = (gpu_fit, system_packages, patch_check, models, gpu_stack, model_patches, draft_config, sglang_service,
       router_stack, router, monitoring)


def ordered(roles) -> list:
    """`roles` in an order where each follows those of its AFTER that are among them; otherwise as
    given.  A cycle is a bug in the roles, said at import."""
    todo, out = list(roles), []
    names = {r.NAME for r in todo}
    while todo:
        ready = next((r for r in todo if not (set(r.AFTER) & names) - {o.NAME for o in out}), None)
        if ready is None:
            raise AssertionError("roles wait on each other: " + ", ".join(r.NAME for r in todo))
        todo.remove(ready)
        out.append(ready)
    return out


def vocabulary(roles=ALL) -> dict:
    """Every host var: the engine's and those each role declares, which must agree where two
    roles read the same one."""
    out = dict(ENGINE_VARS)
    for role in roles:
        for key, schema in role.VARS.items():
            if out.setdefault(key, schema) != schema:
                raise AssertionError(f"role {role.NAME} declares host var {key!r} unlike another reader of it")
    return out


VOCABULARY = vocabulary()
DEPLOY = ordered(r for r in ALL if r is not system_packages)  # what `inv deploy` (and verify, status) run
BOOTSTRAP = ordered([system_packages, *DEPLOY])  # a bare box: its packages first
