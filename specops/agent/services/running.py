"""Whether a running service runs what was deployed: it started after every managed file it
runs from last changed (and after each bytecode purge), and after its weights last changed."""
import os
import time

from specops.agent.converge.venvs import resolve_key
from specops.agent.host import read_state
from specops.agent.weights import read_manifest
from specops.layout import restart_stamp_is_stale


def stale_check(svc, report, unit):
    """The process must have started after every managed file changed (else it runs old code)."""
    started = unit.get("ExecMainStartTimestamp")
    purges, events = read_state().get("purges", {}), []
    for key in svc.managed:
        path = resolve_key(key)
        if path and os.path.exists(path):
            events.append((os.stat(path).st_mtime, path))
        if path in purges:
            events.append((purges[path]["purged_at"], "the bytecode purge of " + path))
    weights = []
    for dest in svc.weights:
        changed_at = (read_manifest(dest) or {}).get("changed_at")
        if changed_at:
            weights.append((changed_at, dest))
    if restart_stamp_is_stale(started, events + weights):
        newest = max(events + weights)
        at = (time.strftime("%H:%M:%S", time.gmtime(started)), time.strftime("%H:%M:%S", time.gmtime(newest[0])))
        report.failures.append("weights changed since the server started: it started at %s, the weights in %s "
                               "changed at %s" % (at[0], newest[1], at[1]) if newest in weights else
                               "running old code: the service started at %s, before %s changed at %s"
                               % (at[0], newest[1], at[1]))
        report.stale = True
