"""Roles: each a short checklist of ops built from a host's inventory vars.

Each role module has NAME, VARS (the host vars it reads: specops/inventory/schema.py assembles
the inventory's vocabulary from them), AFTER (the roles it must follow when they run too),
optionally REPROBE, and ops(host).
"""
from . import (draft_config, gpu_fit, gpu_stack, model_patches, models, monitoring, patch_check, router,  # noqa: E402
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
