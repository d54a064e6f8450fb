"""A router's membership and a worker's load, for a rolling deploy behind SGLang's router.

On the router's host: list its workers, take one out (DELETE /workers/<id>, answered 202 and
done soon after: wait until it is no longer listed), put one back (POST /workers {"url"},
answered 202; the router health-checks it first: wait until it is listed healthy).  On a
worker's host: wait until the service has no request in flight (SGLang's GET /v1/loads: one
entry per DP rank with num_running_reqs and num_waiting_reqs).

Keyed requests go only to the unit that holds the port, as verify's do.
"""
import json
import time

from specops import protocol
from specops.agent import listeners
from specops.agent.host import ActionError, say
from specops.agent.procs import Unit
from specops.agent.service_http import _http, api_key, members as listed


def _guarded(svc):
    problem = listeners.Listener(svc.name, svc.port).problem()
    if problem:
        raise ActionError("%s:%d: %s; specops sends it nothing" % (svc.host, svc.port, problem))
    return api_key(svc.name)


def _wait(svc, key, done, timeout, what):
    t0 = time.time()
    while True:
        have = listed(svc, key)
        if done(have):
            return protocol.MembersResult(members=have, waited=round(time.time() - t0, 2))
        if time.time() - t0 > timeout:
            raise ActionError("router %s: %s not done after %.0f s" % (svc.name, what, timeout))
        time.sleep(0.25)


def members(req):
    """Answer a protocol.RouterMembers."""
    return protocol.MembersResult(members=listed(req.router, _guarded(req.router)))


def remove(req):
    """Answer a protocol.RouterRemove (a worker not listed is already out)."""
    svc = req.router
    if not Unit(svc.name).active:
        return protocol.MembersResult(absent=True)
    key = _guarded(svc)
    entry = listed(svc, key).get(req.url)
    if entry is not None:
        status, raw = _http(svc, "DELETE", "/workers/%s" % entry["id"], key=key)
        if status not in (200, 202, 204):
            raise ActionError("router %s: DELETE /workers/%s answered %s" % (svc.name, entry["id"], status))
    res = _wait(svc, key, lambda have: req.url not in have, req.timeout, "taking out " + req.url)
    say("  router %s: %s taken out (%.1f s)" % (svc.name, req.url, res.waited))
    return res


def add(req):
    """Answer a protocol.RouterAdd (a worker already listed is not added twice)."""
    svc = req.router
    if not Unit(svc.name).active:
        return protocol.MembersResult(absent=True)
    key = _guarded(svc)
    if req.url not in listed(svc, key):
        status, raw = _http(svc, "POST", "/workers", {"url": req.url}, key=key)
        if status not in (200, 201, 202):
            raise ActionError("router %s: POST /workers answered %s: %s" % (svc.name, status, raw[:200]))
    res = _wait(svc, key, lambda have: (have.get(req.url) or {}).get("is_healthy"), req.timeout,
                "putting back " + req.url)
    say("  router %s: %s back and healthy (%.1f s)" % (svc.name, req.url, res.waited))
    return res


def _load(svc, key, path):
    status, raw = _http(svc, "GET", path, timeout=10, key=key)
    if status != 200:
        raise ActionError("%s %s answered %s" % (svc.name, path, status))
    loads = json.loads(raw).get("loads") or []
    return (sum(int(x.get("num_running_reqs") or 0) for x in loads),
            sum(int(x.get("num_waiting_reqs") or 0) for x in loads))


def idle(req):
    """Answer a protocol.WorkerIdle: idle when two reads `settle` s apart both say nothing runs
    or waits (a request the router sent just before it let go may still be arriving)."""
    svc, t0, quiet = req.service, time.time(), 0
    if not Unit(svc.name).active:  # not serving: nothing in flight
        return protocol.IdleResult(idle=True, waited=0.0)
    key = _guarded(svc)
    while True:
        running, waiting = _load(svc, key, req.loads)
        quiet = quiet + 1 if running + waiting == 0 else 0
        if quiet >= 2:
            say("  %s: no request in flight (%.1f s)" % (svc.name, time.time() - t0))
            return protocol.IdleResult(idle=True, waited=round(time.time() - t0, 2))
        if time.time() - t0 > req.timeout:
            return protocol.IdleResult(idle=False, waited=round(time.time() - t0, 2), running=running,
                                       waiting=waiting)
        time.sleep(req.settle)
