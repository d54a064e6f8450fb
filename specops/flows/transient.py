"""A GPU window and the transient units it serves: spec-bench's baseline and spec-tune's
candidates.  The service is stopped (its GPUs proven free), the body runs, and the service is
always started again and verified; each transient unit runs the service's own command (minus
what differs) as specops-baseline-<service>, and is stopped with its GPUs proven free again."""
from __future__ import annotations

import contextlib

from . import pipeline, rolling
from .. import kinds, protocol
from ..errors import SpecopsError
from ..layout import BASELINE_PREFIX


def window(run, svc: dict, body, deployed: list | None = None):
    """A GPU window: stop the service (GPUs proven free), run `body(serve)`, and always start the
    service again and verify it (against `deployed`, a deploy not recorded yet, else the current
    release).  `serve(argv, label=, what=)` is a context that runs argv as the transient unit
    specops-baseline-<service> until it is ready and yields its name, then stops it, GPUs proven
    free again.  A worker is out of its routers meanwhile, and back once it verifies."""
    return rolling.out_of_routers(run, lambda: pipeline.in_window(
        run, [svc["name"]], lambda: body(lambda argv, **kw: serving(run, svc, argv, **kw)), deployed), [svc["name"]])


class GpusBusy(SpecopsError):
    """A transient unit stopped, and its GPUs are not free: the window cannot go on."""


@contextlib.contextmanager
def serving(run, svc: dict, argv: list, label: str = "baseline", what: str = "the target without speculation"):
    name, kind = svc["name"], kinds.kind_of(svc)
    env = dict(svc.get("env") or {})
    if svc.get("cuda_visible_devices"):
        env["CUDA_VISIBLE_DEVICES"] = str(svc["cuda_visible_devices"])
    ref, transient = kind.unit(svc), BASELINE_PREFIX + name
    check = kind.check(run.host, svc)
    try:
        run.call(protocol.BaselineStart(
            service=name, argv=argv, port=check.port, host=check.host, properties=kind.properties(svc),
            ready=check.endpoints.ready, env=env, gpus=ref.gpus, timeout=check.timeout, label=label, what=what),
            on_stderr=lambda line: run.say(line.strip()))
        yield transient
    finally:  # however it went (it may not have started, or been cut off): stopped
        res = run.call(protocol.Stop(services=[protocol.UnitRef(name=transient, gpus=ref.gpus,
                                                                titles=ref.titles, grace=ref.grace)],
                                     others=list(kinds.unit_refs(run.host))),
                       on_stderr=lambda line: run.say(line.strip()))
        for s in res.services:
            freed = ", ".join(f"GPU {i}: {mib} MiB" for i, mib in sorted(s.freed_mib.items())) or "none held"
            run.say(f"{label} stopped; freed {freed}; {len(s.left)} compute app(s) left on the GPUs")
            if s.failures or s.left:
                raise GpusBusy(f"the {label} left the GPUs busy: {'; '.join(s.failures) or s.left}")


def plain_argv(run, svc: dict) -> list[str]:
    """The baseline's command: the service's own, without its speculative arguments.  Refused when
    speculation would still be asked for (a --speculative-* flag in extra_args)."""
    argv = kinds.kind_of(svc).argv({**svc, "speculative": None}, kinds.venv_of(run.host))
    left = [a for a in argv if a.startswith("--speculative")]
    if left:
        raise SpecopsError(f"{svc['name']}: the baseline would still speculate ({left[0]} in extra_args); "
                           "put speculation under `speculative:`")
    return argv
