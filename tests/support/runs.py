"""Stand-ins for a host's run (specops/run.py: HostRun) in the pipeline's tests without a fleet."""
from types import SimpleNamespace

from specops.inventory import Host


def switchless_run(kept, sent):
    """A run whose batch switched nothing, that kept `kept`; its requests go to `sent`."""
    return SimpleNamespace(host=Host("t1", {}), applied=[], acted=True, kept=kept, applying=False,
                           opts=SimpleNamespace(provenance=None), report=SimpleNamespace(notes=[]),
                           call=lambda req, **kw: sent.append(req))
