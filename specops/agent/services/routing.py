"""A router's membership and a worker's load, for a rolling deploy behind SGLang's router.

On the router's host: list its workers, take one out (DELETE /workers/<id>, answered 202 and
done soon after: wait until it is no longer listed), put one back (POST /workers {"url"},
answered 202; the router health-checks it first: wait until it is listed healthy).  On a
worker's host: wait until the service has no request in flight (SGLang's GET /v1/loads: one
entry per DP rank with num_running_reqs and num_waiting_reqs).

Keyed requests go only to the unit that holds the port, as verify's do.
"""
import time

from specops import protocol
from specops.agent.services import listeners
from specops.agent.host import ActionError, clean, run_quiet, say
from specops.agent.lean import loads
from specops.agent.services.procs import Unit
from specops.agent.services import asking


def listed(svc, key):
    """url → {"is_healthy", "load", "id"} for what endpoints.members lists."""
    status, raw = asking.call(svc, "GET", svc.endpoints.members, timeout=10, key=key)
    if status != 200:
        raise ValueError("%s answered %s" % (svc.endpoints.members, status))
    return {w.get("url"): {"is_healthy": w.get("is_healthy"), "load": w.get("load"), "id": w.get("id")}
            for w in loads(raw).get("workers", [])}


def members_check(svc, report, key, listener):
    """Every intended member listed and healthy, and no other (a router registers and health-checks
    its workers after it starts: this waits for that, up to the check's timeout)."""
    deadline = time.time() + svc.timeout
    while True:
        try:
            problem = listener.problem()
            if problem:
                raise ValueError(problem)
            have = listed(svc, key)
            missing = [u for u in svc.members if u not in have]
            sick = [u for u in svc.members if u in have and not have[u]["is_healthy"]]
        except (OSError, ValueError) as e:
            have, missing, sick = {}, list(svc.members), []
            error = str(e)
        else:
            error = None
        if not missing and not sick:
            extra = sorted(set(have) - set(svc.members))
            if extra:  # a worker nobody intended receives what is sent through the router
                report.failures.append("%s also lists %s, which is not one of its workers" % (
                    svc.endpoints.members, ", ".join(extra)))
                return False
            report.checks.append("%s: %d worker(s), all healthy" % (svc.endpoints.members, len(svc.members)))
            return True
        if time.time() > deadline:
            said = said_of(svc.name, missing + sick)

            def named(urls):
                return ", ".join(u + (" (the router's log: %s)" % said[u] if u in said else "") for u in urls)
            report.failures.append("%s: %s" % (svc.endpoints.members, error or "; ".join(
                (["not listed: " + named(missing)] if missing else []) +
                (["not healthy: " + named(sick)] if sick else []))))
            return False
        time.sleep(0.5)


# What sglang-router 0.3.2 logs of a worker it cannot use, as it runs (tracing's lines: time, level,
# target, source file and line, message):
#   WARN smg::workflow::event: .../event.rs:233: Step failed ... step_id=detect_connection_mode error="Step failed:
#     detect_connection_mode - Both HTTP and gRPC health checks failed for URL: HTTP: Health check failed: error
#     sending request for url (URL/health), gRPC: ..." will_retry=true          (registering it: never listed)
#   WARN smg::core::worker: .../worker.rs:948: HTTP health check failed for URL/health: reqwest::Error { ...
#     message: "Connection refused" }) }                                         (listed, then not healthy)
#   INFO smg::core::steps::worker::local::update_remaining_policies: ...: Removed worker URL   (DELETE /workers/<id>)
# (re is imported where a router's words are read: a verify, every no-op's, reads none)
SAID = r"\b(?:WARN|ERROR)\b.*?\.rs:\d+: (.*)|\bINFO\b.*?\.rs:\d+: (Removed worker .*)"


def said_of(unit, urls):
    """url → why the router (this run of its unit) last said it could not use it, from its log."""
    invocation = Unit(unit).current
    if not urls or not invocation:
        return {}
    # --all: every line as logged, colour sequences and all (clean() removes them); -n: a router logs
    # two lines per request it serves, and the last of these are enough
    _, out = run_quiet(["journalctl", "_SYSTEMD_INVOCATION_ID=" + invocation, "--all", "-o", "cat", "--no-pager",
                        "-n", "20000"], timeout=20)
    return said_in(out, urls)


def said_in(log, urls):
    """url → the reason the last line of `log` that names it gives (see SAID)."""
    import re
    found, pattern = {}, re.compile(SAID)
    for line in clean(log).splitlines():
        said = pattern.search(line)
        for url in urls:
            if said and re.search(re.escape(url) + r"(?!\d)", line):  # (?!\d): not a longer port
                found[url] = _reason(said.group(1) or said.group(2))
    return found


def _reason(message):
    """The part of a router's log message that says why: the HTTP attempt's error (a worker URL is
    http://, so its gRPC attempt says nothing more), and the OS's word for a failed connect."""
    import re
    error = re.search(r'error="((?:[^"\\]|\\.)*)"', message)
    if error:
        message = re.sub(r'\\(.)', r'\1', error.group(1))
    http_part = re.search(r"\bHTTP: (.*?), gRPC: ", message)
    if http_part:
        message = http_part.group(1)
    os_error = re.search(r'^(.*?): reqwest::Error \{.*?message: "([^"]*)"', message)
    if os_error:
        message = "%s: %s" % os_error.groups()
    return message[:300]


class Guarded:
    """The service's API key, given out only while the service's unit holds its port: asked before
    every keyed request (a service that dies mid-wait frees its port for anyone)."""

    def __init__(self, svc):
        self.svc, self.listener, self._key = svc, listeners.Listener(svc.name, svc.port), asking.api_key(svc.name)

    def key(self):
        problem = self.listener.problem()
        if problem:
            raise ActionError("%s:%d: %s; specops sends it nothing" % (self.svc.host, self.svc.port, problem))
        return self._key


def _wait(svc, guard, done, timeout, what):
    t0 = time.time()
    while True:
        have = listed(svc, guard.key())
        if done(have):
            return protocol.MembersResult(members=have, waited=round(time.time() - t0, 2))
        if time.time() - t0 > timeout:
            raise ActionError("router %s: %s not done after %.0f s" % (svc.name, what, timeout))
        time.sleep(0.25)


def not_serving(svc, key):
    """Why a one-token generation through the router fails (None: it generated).  With every
    worker's circuit breaker open, sglang-router 0.3.2 answers 503 no_available_workers for about
    60 s while GET /workers still lists each worker healthy: only a request through it shows it."""
    body = dict(svc.generate_body or {}, text=svc.prompt)
    body["sampling_params"] = dict(body.get("sampling_params") or {}, max_new_tokens=1)
    try:
        status, raw = asking.call(svc, "POST", svc.endpoints.generate, body, timeout=30, key=key)
    except OSError as e:
        return "%s: %s" % (svc.endpoints.generate, e)
    return None if status == 200 else "%s answered %s: %s" % (
        svc.endpoints.generate, status, clean(raw[:200].decode(errors="replace")))


def members(req):
    """Answer a protocol.RouterMembers (with serving_within: generating through it until it does)."""
    svc = req.router
    if not Unit(svc.name).active:
        return protocol.MembersResult(absent=True)
    guard, t0 = Guarded(svc), time.time()
    res = protocol.MembersResult(members=listed(svc, guard.key()))
    if req.serving_within is None:
        return res
    while True:
        problem = not_serving(svc, guard.key())
        if problem is None or time.time() - t0 >= req.serving_within:
            break
        if problem != res.not_serving:
            say("  router %s: not serving: %s" % (svc.name, problem))
        res.not_serving = problem
        time.sleep(1)
    res.waited = round(time.time() - t0, 2)
    if problem is None and res.not_serving:
        say("  router %s: serving again after %.0f s" % (svc.name, res.waited))
    res.not_serving = problem
    return res


def _running(req):
    """(the router, its guarded key) of a RouterRemove or RouterAdd; None when its unit is not running."""
    return (req.router, Guarded(req.router)) if Unit(req.router.name).active else None


def remove(req):
    """Answer a protocol.RouterRemove (a worker not listed is already out)."""
    up = _running(req)
    if up is None:
        return protocol.MembersResult(absent=True)
    svc, guard = up
    entry = listed(svc, guard.key()).get(req.url)
    if entry is not None:
        import re
        if not re.match(r"^[A-Za-z0-9_.-]+$", str(entry.get("id"))):
            raise ActionError("router %s: a worker id that is not a plain name: %r" % (svc.name, entry.get("id")))
        status, raw = asking.call(svc, "DELETE", "/workers/%s" % entry["id"], key=guard.key())
        if status not in (200, 202, 204):
            raise ActionError("router %s: DELETE /workers/%s answered %s" % (svc.name, entry["id"], status))
    res = _wait(svc, guard, lambda have: req.url not in have, req.timeout, "taking out " + req.url)
    say("  router %s: %s taken out (%.1f s)" % (svc.name, req.url, res.waited))
    return res


def add(req):
    """Answer a protocol.RouterAdd (a worker already listed is not added twice)."""
    up = _running(req)
    if up is None:
        return protocol.MembersResult(absent=True)
    svc, guard = up
    if req.url not in listed(svc, guard.key()):
        status, raw = asking.call(svc, "POST", "/workers", {"url": req.url}, key=guard.key())
        if status not in (200, 201, 202):
            raise ActionError("router %s: POST /workers answered %s: %s" % (svc.name, status, raw[:200]))
    res = _wait(svc, guard, lambda have: (have.get(req.url) or {}).get("is_healthy"), req.timeout,
                "putting back " + req.url)
    say("  router %s: %s back and healthy (%.1f s)" % (svc.name, req.url, res.waited))
    return res


def _load(svc, key, path):
    status, raw = asking.call(svc, "GET", path, timeout=10, key=key)
    if status != 200:
        raise ActionError("%s %s answered %s" % (svc.name, path, status))
    ranks = loads(raw).get("loads") or []
    return (sum(int(x.get("num_running_reqs") or 0) for x in ranks),
            sum(int(x.get("num_waiting_reqs") or 0) for x in ranks))


def idle(req):
    """Answer a protocol.WorkerIdle: idle when two reads `settle` s apart both say nothing runs
    or waits (a request the router sent just before it let go may still be arriving)."""
    svc, t0, quiet = req.service, time.time(), 0
    if not Unit(svc.name).active:  # not serving: nothing in flight
        return protocol.IdleResult(idle=True, waited=0.0)
    guard = Guarded(svc)
    running = waiting = None
    while True:
        try:
            running, waiting = _load(svc, guard.key(), req.loads)
        except OSError:  # not answering this moment: not known to be idle
            quiet = 0
        else:
            quiet = quiet + 1 if running + waiting == 0 else 0
        if quiet >= 2:
            say("  %s: no request in flight (%.1f s)" % (svc.name, time.time() - t0))
            return protocol.IdleResult(idle=True, waited=round(time.time() - t0, 2))
        if time.time() - t0 > req.timeout:
            return protocol.IdleResult(idle=False, waited=round(time.time() - t0, 2), running=running or 0,
                                       waiting=waiting or 0)
        time.sleep(req.settle)
