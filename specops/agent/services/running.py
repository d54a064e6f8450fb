"""Whether a running service runs what was deployed: it started after every managed file it
runs from last changed (and after each bytecode purge), and after its weights last changed (in
content, or any file of theirs written: its ctime), which are still what their manifest says."""
import os
import time

from specops.agent.converge.venvs import resolve_key
from specops.agent.host import read_state
from specops.layout import restart_stamp_is_stale


def _hms(t):
    return time.strftime("%H:%M:%S", time.gmtime(t))


def stale_check(svc, report, unit):
    """The process must have started after every managed file changed (else it runs old code)."""
    started = unit.get("ExecMainStartTimestamp")
    purges, events, managed = read_state().get("purges", {}), [], set()
    for key in svc.managed:
        path = resolve_key(key)
        managed.add(path)
        if path and os.path.exists(path):
            events.append((os.stat(path).st_mtime, path))
        if path in purges:
            events.append((purges[path]["purged_at"], "the bytecode purge of " + path))
    weights, differ = [], []
    if svc.weights:
        from specops.agent.weights import seen  # only then: the weights package costs every verify
    for dest in svc.weights:
        manifest, changed, newest = seen(dest)
        if (manifest or {}).get("changed_at"):
            weights.append((manifest["changed_at"], dest))
        if newest:
            weights.append((newest[0], "%s (%s)" % (dest, newest[1])))
        # a file the service manages (the draft's config.json with draft_config) is checked as its code is
        differ += [p for p in ("%s/%s" % (dest, name) for name in changed) if p not in managed]
    if restart_stamp_is_stale(started, events + weights):
        newest = max(events + weights)
        at = (_hms(started), _hms(newest[0]))
        report.failures.append("weights changed since the server started: it started at %s, the weights in %s "
                               "changed at %s" % (at[0], newest[1], at[1]) if newest in weights else
                               "running old code: the service started at %s, before %s changed at %s"
                               % (at[0], newest[1], at[1]))
        report.stale = True
    elif differ and started:
        report.failures.append("weights differ from their manifest: %s%s changed on the host before the server "
                               "started (at %s); a deploy puts back the manifest's and restarts it"
                               % (differ[0], " and %d more" % (len(differ) - 1) if differ[1:] else "", _hms(started)))
        report.stale = True
