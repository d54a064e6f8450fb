"""The textfile step: after a deploy, a rollback or a verify, the agent rewrites node_exporter's
textfile (specops/agent/textfile.py) in the round trip of the run's last call; only on hosts
with `monitoring:` (the monitoring role's var)."""
from __future__ import annotations

from .. import protocol
from ..inventory.node_exporter import settings
from ..run import HostRun


def after(run: HostRun) -> None:
    """Have the run's last call rewrite the textfile (not in check mode: status writes nothing)."""
    monitoring = settings(run.host)
    if monitoring and not run.opts.check:
        # an epilogue goes without the lock (it may follow the Unlock that gives it back)
        assert not protocol.changes_host(protocol.Textfile.KIND)
        run.epilogue.append(protocol.Textfile(directory=monitoring.textfile_dir))
