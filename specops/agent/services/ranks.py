"""A multi-node service's rank > 0, as verify sees it: it serves only a health check (SGLang
0.5.23's launch_dummy_health_check_server), so its unit must run, hold its port and answer
/health; a unit stopped or failed, with no job queued, is not coming, and is said so at once
(ServiceReport.rank_down), for rank 0's verify, which waits for every rank (flows/verify.py)."""
import time

from specops.agent.converge.probe import unit_fact
from specops.agent.host import journal
from specops.agent.services import listeners
from specops.agent.services import asking, running


def rank_running(svc, report):
    """A multi-node service's rank > 0 serves only a health check (SGLang's dummy health server):
    its unit runs, its port is the unit's, and /health answers 200.  Rank 0's verify, which
    needs every rank joined, says the rest."""
    t0, u, status = time.time(), unit_fact(svc.name), None
    while time.time() - t0 < svc.timeout:
        up = (u.get("ActiveState"), u.get("SubState")) == ("active", "running")
        if up and listeners.Listener(svc.name, svc.port, u).problem() is None:
            try:
                status, _ = asking.call(svc, "GET", svc.endpoints.ready, timeout=5)
            except OSError:
                status = "no answer"
            if status == 200:
                report.checks.append("rank > 0: unit %s running, %s 200 (the API is rank 0's)"
                                     % (svc.name, svc.endpoints.ready))
                running.stale_check(svc, report, u)
                return report
        elif u.get("ActiveState") in ("failed", "inactive") and u.get("Job") in (None, "", "0"):  # none queued
            report.rank_down = "unit %s is %s/%s" % (svc.name, u.get("ActiveState"), u.get("SubState"))
            break
        time.sleep(0.5)  # a rank whose peer restarted is restarted by systemd and joins again
        u = unit_fact(svc.name)
    report.failures.append("unit %s is %s/%s, %s: %s: this node's rank is not serving" % (
        svc.name, u.get("ActiveState"), u.get("SubState"), svc.endpoints.ready, status))
    report.journal = asking.redacted(svc.name, journal(svc.name, invocation=u.get("InvocationID")))
    return report
