"""Verify and peek: ask a service over its HTTP endpoints whether it runs what was intended.

What to ask (paths, the generation body, the intended fields) comes in each
protocol.ServiceCheck, from the service's kind on the controller; nothing here knows
one kind of service from another.
"""
import time

from specops import protocol
from specops.agent.lean import loads
from specops.agent.services import asking, listeners, procs, running, verdicts
from specops.agent.host import clean, journal, say
from specops.agent.converge.checks import named
from specops.agent.converge.probe import recent_unit_fact, unit_fact
from specops.agent.services.startup import Startup


GENERATE_TIMEOUT = 600  # seconds one verification generation may take
READY_POLL = 0.25  # seconds between asks while a service starts: its readiness is seen this late at most


_STARTS = {}  # service → the start being waited for, kept when a Verify answers before it ends


def _wait_ready(svc, report, key, answer_by=None):
    """The unit's facts once the service answers ready (None if it died, stalled or hit the
    ceiling).  It may take as long as it keeps making progress (startup.Startup).  With answer_by
    (a time.time()), a start still going then is reported `starting`, and the next Verify resumes
    the same wait, clock and progress, while the unit's run is the same one."""
    u = recent_unit_fact(svc.name)
    w = _STARTS.get(svc.name)
    if w is None or w["run"] != u.get("InvocationID"):
        w = _STARTS[svc.name] = {"run": u.get("InvocationID"), "t0": time.time(), "note": 0.0, "words": None,
                                 "seen": {}, "watch": Startup(svc.name, u.get("InvocationID"), svc.progress,
                                                              svc.stall_timeout)}
    t0, watch, fresh = w["t0"], w["watch"], True
    while True:
        if u.get("ActiveState") in ("failed", "inactive") or u.get("SubState") == "auto-restart":
            report.failures.append("unit %s is %s/%s after %.1fs: the server exited" % (
                svc.name, u.get("ActiveState"), u.get("SubState"), time.time() - t0))
            report.journal = asking.redacted(svc.name, journal(svc.name, invocation=u.get("InvocationID")))
            _STARTS.pop(svc.name, None)
            return None
        try:
            status, _ = asking.call(svc, "GET", svc.endpoints.ready, timeout=5, key=key)
        except OSError:
            status = "no listener"
        if not report.health_statuses or report.health_statuses[-1] != status:
            report.health_statuses.append(status)
        now = time.time()
        if status == 200:
            report.ready_after = round(now - t0, 2)
            say("  %s: ready after %.1fs" % (svc.name, now - t0))
            _STARTS.pop(svc.name, None)
            return u if fresh else unit_fact(svc.name)  # the unit as it is now that it serves
        watch.poll(u.get("ControlGroup"))
        failure = None
        if watch.stalled():
            failure = "stalled: no progress for %.0fs (stall timeout %.0fs; last: %s; %s: %s)" % (
                watch.stalled_for(), svc.stall_timeout, watch.phase or "nothing logged", svc.endpoints.ready, status)
        elif now - t0 > svc.timeout:
            failure = "not ready after %.0fs (last %s: %s), the ceiling (verify.timeout); last progress: %s" % (
                now - t0, svc.endpoints.ready, status, watch.phase or "nothing logged")
        if failure:
            report.failures.append(failure)
            report.journal = asking.redacted(svc.name, journal(svc.name, invocation=u.get("InvocationID")))
            _STARTS.pop(svc.name, None)
            return None
        words = watch.words()
        if words != w["words"] or now - w["note"] >= 5:
            say("  %s: starting (%s: %s) %.0fs elapsed; %s" % (svc.name, svc.endpoints.ready, status, now - t0, words))
            w["note"], w["words"] = now, words
        if answer_by is not None and now >= answer_by:
            report.starting = True
            return None
        time.sleep(READY_POLL)
        main = procs.starttime(int(u.get("MainPID") or 0))  # PID 1 is asked again only when that is gone
        fresh = main is None or main != w["seen"].setdefault(u.get("MainPID"), main)
        if fresh:
            u = unit_fact(svc.name)


def _info(svc, key, timeout=30):
    status, raw = asking.call(svc, "GET", svc.endpoints.info, timeout=timeout, key=key)
    if status == 404 and svc.endpoints.info_fallback:
        status, raw = asking.call(svc, "GET", svc.endpoints.info_fallback, timeout=timeout, key=key)
    return status, (loads(raw) if status == 200 else {})


def _compare(svc, info, report):
    report.effective = {k: info.get(k) for k in svc.intended}
    for field, want in sorted(svc.intended.items()):
        have = info.get(field)
        if have == want:
            continue
        text = "%s: intended %s, effective %s" % (named(field, svc.said_as), want, have)
        if field in svc.accepted and svc.accepted[field] == have:
            report.notes.append(text + " (accepted SGLang adjustment)")
        else:
            report.failures.append(text)


def _generate(svc, report, key):
    body = dict(svc.generate_body or {"text": None, "sampling_params": {}})
    body["text"] = svc.prompt
    body["sampling_params"] = dict(body.get("sampling_params") or {}, max_new_tokens=svc.max_new_tokens,
                                   temperature=0)
    t0 = time.time()
    status, raw = asking.call(
        svc, "POST", svc.endpoints.generate, body, timeout=min(svc.timeout, GENERATE_TIMEOUT), key=key
    )
    wall = time.time() - t0
    if status != 200:
        report.failures.append("%s answered %s: %s" % (svc.endpoints.generate, status, clean(raw[:200].decode(
            errors="replace"))))
        return False
    meta = loads(raw).get("meta_info", {})
    tokens = meta.get("completion_tokens") or 0
    tok_s = tokens / wall if wall > 0 else 0.0
    accept = meta.get("spec_accept_length")
    report.generate = {"completion_tokens": tokens, "tok_s": round(tok_s, 1),
                       "spec_verify_ct": meta.get("spec_verify_ct"), "spec_accept_length": accept}
    if svc.min_accept_length is not None and (accept is None or accept < svc.min_accept_length):
        report.failures.append("spec_accept_length %s is below min_accept_length %s" % (
            "none" if accept is None else "%.2f" % accept, svc.min_accept_length))
    if svc.baseline_tok_s is not None and tok_s < svc.baseline_tok_s:
        report.failures.append("%.1f tok/s is slower than the baseline without speculation (%s tok/s)"
                               % (tok_s, svc.baseline_tok_s))
    return True


def _ours(svc, report, listener):
    problem = listener.problem()
    if problem:
        report.failures.append("%s:%d: %s; verify sends it nothing more" % (svc.host, svc.port, problem))
    return problem is None



def verify_service(svc, answer_by=None):
    """One service: ready, really the service on its port, serving its model, running the intended
    arguments, generating (with its speculative stats), and not running older code than its files."""
    report, key = protocol.ServiceReport(name=svc.name), asking.api_key(svc.name)
    if not svc.http:
        # ranks here, routing for a router's members: a verify of one HTTP service imports neither
        from specops.agent.services import ranks
        return ranks.rank_running(svc, report)
    unit = _wait_ready(svc, report, key, answer_by)
    if unit is None:
        return report
    # Before each request that carries the key (or is believed): is what answers really the service?
    listener = listeners.Listener(svc.name, svc.port, unit)
    if not _ours(svc, report, listener):
        return report
    if svc.endpoints.models:
        status, raw = asking.call(svc, "GET", svc.endpoints.models, key=key)
        ids = [m.get("id") for m in loads(raw).get("data", [])] if status == 200 else []
        if svc.served_model_name and svc.served_model_name not in ids:
            report.failures.append("%s lists %s, not %s" % (svc.endpoints.models, ids or status, svc.served_model_name))
        report.checks.append("%s: %s" % (svc.endpoints.models, ", ".join(map(str, ids))))
    if not _ours(svc, report, listener):
        return report
    status, info = _info(svc, key)
    if status != 200:
        report.failures.append("%s answered %s" % (svc.endpoints.info, status))
        return report
    _compare(svc, info, report)
    if svc.members:
        from specops.agent.services import routing
        if not routing.members_check(svc, report, key, listener):
            return report
    if svc.endpoints.generate and (not _ours(svc, report, listener) or not _generate(svc, report, key)):
        return report
    running.stale_check(svc, report, unit)
    return report


def verify(req):
    """Answer a protocol.Verify."""
    answer_by = time.time() + req.answer_within if req.answer_within else None
    if not req.resume:
        for s in req.services:
            _STARTS.pop(s.name, None)
    reports = [verify_service(s, answer_by) for s in req.services]
    verdicts.record(reports)  # the textfile says whether the last verify passed
    return protocol.VerifyResult(services=reports)


def peek(req):
    """Answer a protocol.Peek: the running servers' effective args against the intended ones."""
    out = []
    for svc in req.services:
        report = protocol.ServiceReport(name=svc.name)
        if not svc.http:
            out.append(report)
            continue
        problem = listeners.Listener(svc.name, svc.port, recent_unit_fact(svc.name)).problem()
        try:
            status, info = (
                ("not ours: %s" % problem, {}) if problem else _info(svc, asking.api_key(svc.name), timeout=5)
            )
        except (OSError, ValueError):
            status, info = "no answer", {}
        if status != 200:
            report.failures.append("%s: %s" % (svc.endpoints.info, status))
        else:
            _compare(svc, info, report)
            report.running = {"version": info.get("version")}
            if svc.endpoints.metrics:  # what answers was found to be the service above
                from specops.agent.services.production import figures
                report.running.update(figures(svc))
            if svc.endpoints.members:
                from specops.agent.services import routing
                try:
                    report.members = routing.listed(svc, asking.api_key(svc.name))
                except (OSError, ValueError) as e:
                    report.failures.append(str(e))
                if listeners.Listener(svc.name, svc.port).problem() is None:  # the key goes only to it
                    report.not_serving = routing.not_serving(svc, asking.api_key(svc.name))
        out.append(report)
    return protocol.VerifyResult(services=out)
