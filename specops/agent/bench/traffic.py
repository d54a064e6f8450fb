"""A traffic sample from SGLang's own request dump (0.5.23: POST /configure_logging sets
dump_requests_folder and dump_requests_threshold on the running server; each `threshold` finished
requests are pickled into <folder>/<second>.pkl), on the host, for the task that uses it.

Checklist of a capture:
  1. the port is the unit's, the unit runs as root, and no dump specops did not start is on
     (the server logs every /configure_logging call at INFO: "[time] Config logging: obj=...");
  2. a directory of root's, 0700, below TRAFFIC_DIR (dumpdir.py), and a chunk directory in it for
     each dump file: as soon as a file appears, the dump moves to the next (two files written in
     one second would have the same name);
  3. the dump on into the first chunk, with the admin key (else the API key);
  4. until `count` requests are read or the time limit; then what the server still holds is
     flushed (threshold 1, for at most FLUSH seconds: SGLang keeps held requests across a dump's
     end, for the next dump anyone turns on), and the dump is off (threshold back to SGLang's 1000);
  5. each file checked and read inertly (dumpfile.py); one that fails refuses the whole sample;
     requests that finished before the dump went on (held from an earlier dump) are left out;
  6. the sample (sample.json, 0600) written and the dump files removed.
On any failure, and on an interruption, the dump is off and the directory gone.  drop() ends a
sample's task the same way.
"""
import ast
import re
import time

from specops import protocol
from specops.agent.bench import dumpdir
from specops.agent.host import ActionError, on_interrupt, run_quiet, say
from specops.agent.services import asking, listeners
from specops.layout import TRAFFIC_DIR

SINCE = "0.5.23"  # the first SGLang whose dump specops reads (its shape: dumpfile.py)
CHUNK = 25        # requests a dump file holds
POLL = 0.1
FLUSH = 5.0       # seconds to wait, at the end, for a request that makes the server write what it holds
DEFAULT_THRESHOLD = 1000  # SGLang's dump_requests_threshold, put back when the dump goes off
# At the start of a journal line, as SGLang's logger writes it: a request's own text, which
# --log-requests logs too (repr'd, on one line), cannot start a line with it.
LOGGED = re.compile(r"^\[[^\]\n]*\] Config logging: obj=ConfigureLoggingReq\([^\n]*?\bdump_requests_folder="
                    r"(None|'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\")", re.M)


def current_folder(unit):
    """The dump folder the running unit was last told (None: never told, or not logged: SGLang logs
    the call at INFO), from its current run's journal."""
    _, out = run_quiet(["systemctl", "show", unit, "-p", "InvocationID", "--value"], timeout=30)
    if not out.strip():
        return None
    _, out = run_quiet(["journalctl", "_SYSTEMD_INVOCATION_ID=" + out.strip(), "-o", "cat", "--no-pager"], timeout=60)
    folder = None
    for m in LOGGED.finditer(out):
        value = ast.literal_eval(m.group(1))
        folder = value if value is not None else folder
    return folder


def ours(folder, name):
    return bool(folder) and folder.startswith("%s/%s." % (TRAFFIC_DIR, name))


def _post(svc, body, guard):
    problem = guard()
    if problem:  # the admin key goes only to the unit's own server
        raise ActionError("%s: %s" % (svc.name, problem))
    status, answer = asking.call(svc, "POST", svc.endpoints.configure_logging, body, timeout=30,
                                 key=asking.admin_key(svc.name))
    if status != 200:
        why = {404: "has no %s (SGLang %s and later have it)" % (svc.endpoints.configure_logging, SINCE),
               401: "refused the admin key (admin_api_key, else api_key)"}.get(status, "answered HTTP %s" % status)
        raise ActionError("%s:%d %s" % (svc.host, svc.port, why))


def _off(svc, guard):
    _post(svc, {"dump_requests_folder": "", "dump_requests_threshold": DEFAULT_THRESHOLD}, guard)


def refuse_unless_capturable(req, guard):
    svc = req.service
    if not svc.endpoints.configure_logging:
        raise ActionError("%s has no request dump (an SGLang server %s or later has)" % (svc.name, SINCE))
    problem = guard()
    if problem:
        raise ActionError("%s: %s" % (svc.name, problem))
    _, user = run_quiet(["systemctl", "show", req.unit, "-p", "User", "--value"], timeout=30)
    if user.strip() not in ("", "root"):
        raise ActionError("%s runs as %s: its dump files would be %s's, and specops reads only root's"
                          % (svc.name, user.strip(), user.strip()))
    folder = current_folder(req.unit)
    if folder and not ours(folder, svc.name):
        raise ActionError("%s: a request dump specops did not start is on, into %s: left alone; turn it off "
                          "(/configure_logging with dump_requests_folder \"\") or let it end, then run again"
                          % (svc.name, folder))


def capture(req):
    svc, name = req.service, req.service.name
    guard = listeners.Listener(req.unit, svc.port).problem
    refuse_unless_capturable(req, guard)
    dumpdir.remove_samples(name)  # a sample a killed run left (the host lock: no other run is using one)
    reader, on = dumpdir.Reader(name, time.time()), [False]

    def undo():
        try:
            if on[0] or ours(current_folder(req.unit), name):
                _off(svc, guard)
        finally:
            dumpdir.remove_samples(name)
    forget = on_interrupt(undo)
    try:
        _post(svc, {"dump_requests_folder": reader.next_chunk(),
                    "dump_requests_threshold": max(1, min(req.count, CHUNK))}, guard)
        on[0] = True
        say("traffic: the request dump of %s is on; waiting for %d finished requests (at most %.0f s)"
            % (name, req.count, req.timeout))
        t0 = said = time.monotonic()
        while len(reader.requests) < req.count and time.monotonic() - t0 < req.timeout:
            time.sleep(POLL)
            if reader.written():
                _post(svc, {"dump_requests_folder": reader.next_chunk()}, guard)
            reader.poll()
            if time.monotonic() - said >= 10:
                said = time.monotonic()
                say("traffic: %d of %d requests dumped, %.0f s of at most %.0f s"
                    % (len(reader.requests), req.count, said - t0, req.timeout))
        ended = "count" if len(reader.requests) >= req.count else "time"
        flush(svc, guard, reader)
        _off(svc, guard)
        on[0] = False
        settle = time.monotonic()
        while reader.pending and time.monotonic() - settle < dumpdir.SETTLE:  # a write under way at the end
            time.sleep(POLL)
            reader.poll()
        reader.poll(final=True)
        result = reader.sample(ended, req.fetch)
        say("traffic: %d requests from %d dump file(s)%s" % (result.requests, result.files,
                                                            "" if ended == "count" else " (the time limit came first)"))
        return result
    except BaseException:
        undo()
        raise
    finally:
        forget()


def flush(svc, guard, reader):
    """Make the server write what it still holds of this traffic (it would keep it for the next
    dump anyone turns on): threshold 1 into a fresh chunk, until a file comes or FLUSH seconds."""
    _post(svc, {"dump_requests_folder": reader.next_chunk(), "dump_requests_threshold": 1}, guard)
    end = time.monotonic() + FLUSH
    while not reader.written() and time.monotonic() < end:
        time.sleep(POLL)


def drop(req):
    guard = listeners.Listener(req.unit, req.service.port).problem
    was_on = ours(current_folder(req.unit), req.service.name)
    turned_off = False
    try:
        if was_on and not guard():
            _off(req.service, guard)
            turned_off = True
    finally:
        removed = dumpdir.remove_samples(req.service.name)
    return protocol.TrafficDropped(removed=removed, dump_was_on=was_on, turned_off=turned_off)
