"""A traffic sample from SGLang's own request dump (0.5.23: POST /configure_logging sets
dump_requests_folder and dump_requests_threshold on the running server; each `threshold` finished
requests are pickled into <folder>/<second>.pkl), on the host, for the task that uses it.

Checklist of a capture:
  1. the port is the unit's, the unit runs as root, and no dump specops did not start is on
     (the server logs every /configure_logging call: "Config logging: obj=...dump_requests_folder=...");
  2. a directory of root's, 0700, below TRAFFIC_DIR, and a chunk directory in it per dump file;
  3. the dump on into the first chunk, with the admin key; after each file, the next chunk (two
     files written in one second would have the same name);
  4. until `count` requests are read or the time limit; then the dump off;
  5. each file checked and read inertly (dumpfile.py); one that fails refuses the whole sample;
  6. the sample (sample.json, 0600) written and the dump files removed.
On any failure, and on an interruption, the dump is off and the directory gone.  drop() ends a
sample's task the same way.
"""
import ast
import json
import os
import pickle
import re
import secrets
import shutil
import time

from specops import protocol
from specops.agent import safefs
from specops.agent.bench import dumpfile
from specops.agent.host import ActionError, on_interrupt, run_quiet, say, sha256
from specops.agent.services import asking, listeners
from specops.layout import TRAFFIC_DIR

SINCE = "0.5.23"  # the first SGLang whose dump specops reads (its shape: dumpfile.py)
CHUNK = 25        # requests a dump file holds
POLL = 0.2
SETTLE = 10.0     # seconds a file that does not load yet may still be being written
SAMPLE = "sample.json"
LOGGED = re.compile(r"Config logging: obj=ConfigureLoggingReq\(.*?\bdump_requests_folder=(None|'(?:[^'\\]|\\.)*'"
                    r'|"(?:[^"\\]|\\.)*")')


def current_folder(unit):
    """The dump folder the running unit was last told (None: never told, or not logged: SGLang logs
    the call at INFO), from its current run's journal."""
    _, out = run_quiet(["systemctl", "show", unit, "-p", "InvocationID", "--value"])
    if not out.strip():
        return None
    _, out = run_quiet(["journalctl", "_SYSTEMD_INVOCATION_ID=" + out.strip(), "-o", "cat", "--no-pager"])
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
    _post(svc, {"dump_requests_folder": ""}, guard)


def _remove_samples(name):
    """Every sample directory of service `name` (specops's: in its root-only TRAFFIC_DIR)."""
    try:
        fd, _ = safefs.open_dir(TRAFFIC_DIR)
    except safefs.Missing:
        return False
    try:
        found = [n for n in os.listdir(fd) if n.startswith(name + ".")]
    finally:
        os.close(fd)
    for n in found:
        shutil.rmtree(os.path.join(TRAFFIC_DIR, n))  # fd-based: a link in it is removed, never followed
    return bool(found)


def refuse_unless_capturable(req, guard):
    svc = req.service
    if not svc.endpoints.configure_logging:
        raise ActionError("%s has no request dump (an SGLang server %s or later has)" % (svc.name, SINCE))
    problem = guard()
    if problem:
        raise ActionError("%s: %s" % (svc.name, problem))
    _, user = run_quiet(["systemctl", "show", req.unit, "-p", "User", "--value"])
    if user.strip() not in ("", "root"):
        raise ActionError("%s runs as %s: its dump files would be %s's, and specops reads only root's"
                          % (svc.name, user.strip(), user.strip()))
    folder = current_folder(req.unit)
    if folder and not ours(folder, svc.name):
        raise ActionError("%s: a request dump specops did not start is on, into %s: left alone; turn it off "
                          "(/configure_logging with dump_requests_folder \"\") or let it end, then run again"
                          % (svc.name, folder))


class Reader:
    """The dump files of a sample, read as they are complete."""

    def __init__(self, path):
        self.path, self.requests, self.files, self.pending = path, [], 0, {}

    def chunk_dir(self, n):
        d = "%s/d%d" % (self.path, n)
        safefs.make_dir(d, 0o700, 0, 0)
        return d

    def poll(self, final=False):
        """Read each complete file; a file still failing to load after SETTLE seconds (or at the
        end, `final`) refuses the sample.  How many files were read."""
        fd, _ = safefs.open_dir(self.path)
        read = 0
        try:
            for chunk in sorted(n for n in os.listdir(fd) if n.startswith("d")):
                cfd = os.open(chunk, safefs.O_DIR, dir_fd=fd)
                try:
                    for name in sorted(os.listdir(cfd)):
                        where = "%s/%s/%s" % (self.path, chunk, name)
                        data = dumpfile.read(cfd, name, where)
                        try:
                            self.requests += dumpfile.load(data, where)
                        except (EOFError, pickle.UnpicklingError) as e:
                            first = self.pending.setdefault(where, time.monotonic())
                            if final or time.monotonic() - first > SETTLE:
                                raise dumpfile.Refused("%s: not a whole pickle (%s)" % (where, type(e).__name__))
                            continue
                        os.unlink(name, dir_fd=cfd)  # read: only its prompts are kept
                        self.pending.pop(where, None)
                        self.files += 1
                        read += 1
                finally:
                    os.close(cfd)
        finally:
            os.close(fd)
        return read


def capture(req):
    svc, name = req.service, req.service.name
    guard = listeners.Listener(req.unit, svc.port).problem
    refuse_unless_capturable(req, guard)
    _remove_samples(name)  # a sample a killed run left (the host lock: no other run is using one)
    safefs.make_dir(TRAFFIC_DIR, 0o700, 0, 0, parents=True)
    path = "%s/%s.%s" % (TRAFFIC_DIR, name, secrets.token_hex(4))
    safefs.make_dir(path, 0o700, 0, 0)
    on = [False]

    def undo():
        if on[0] or ours(current_folder(req.unit), name):
            _off(svc, guard)
        _remove_samples(name)
    forget = on_interrupt(undo)
    try:
        reader = Reader(path)
        chunk = max(1, min(req.count, CHUNK))
        _post(svc, {"dump_requests_folder": reader.chunk_dir(0), "dump_requests_threshold": chunk}, guard)
        on[0] = True
        say("traffic: the request dump of %s is on; waiting for %d finished requests (at most %.0f s)"
            % (name, req.count, req.timeout))
        t0, said, n = time.monotonic(), time.monotonic(), 0
        while len(reader.requests) < req.count and time.monotonic() - t0 < req.timeout:
            time.sleep(POLL)
            if reader.poll():
                n += 1
                _post(svc, {"dump_requests_folder": reader.chunk_dir(n)}, guard)
            if time.monotonic() - said >= 10:
                said = time.monotonic()
                say("traffic: %d of %d requests dumped, %.0f s of at most %.0f s"
                    % (len(reader.requests), req.count, said - t0, req.timeout))
        ended = "count" if len(reader.requests) >= req.count else "time"
        _off(svc, guard)
        on[0] = False
        settle = time.monotonic()
        while reader.pending and time.monotonic() - settle < SETTLE:  # a write under way when it went off
            time.sleep(POLL)
            reader.poll()
        reader.poll(final=True)
        result = write_sample(reader, path, ended, req.fetch)
        say("traffic: %d requests from %d dump file(s)%s" % (result.requests, result.files,
                                                            "" if ended == "count" else " (the time limit came first)"))
        return result
    except BaseException:
        undo()
        raise
    finally:
        forget()


def write_sample(reader, path, ended, fetch):
    prompts, skipped, ids = [], 0, 0
    for fields, _out, _created, _finished in reader.requests:
        made = dumpfile.prompts(fields)
        skipped += not made
        ids += sum("input_ids" in p for p in made)
        prompts += made
    if not prompts:
        raise ActionError("traffic: no request with text or token ids was dumped%s"
                          % (" in the time given: more time (--traffic-wait), or traffic" if ended == "time" else ""))
    data = json.dumps(prompts).encode()
    fd = os.open(path + "/" + SAMPLE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    times = [t for r in reader.requests for t in r[2:]]
    return protocol.TrafficSample(path=path + "/" + SAMPLE, sha256=sha256(data).hexdigest(), requests=len(prompts),
                                  bytes=len(data), first=min(times) if times else None,
                                  last=max(times) if times else None, files=reader.files, ended=ended,
                                  skipped=skipped, token_ids=ids, prompts=prompts if fetch else None)


def read_sample(path, digest):
    """The prompts of a sample this agent wrote (in TRAFFIC_DIR, root's), still as captured."""
    if not path.startswith(TRAFFIC_DIR + "/") or not path.endswith("/" + SAMPLE):
        raise ActionError("%s: not a traffic sample" % path)
    data = safefs.read_file(path)
    if data is None or sha256(data).hexdigest() != digest:
        raise ActionError("%s: the traffic sample is gone or changed since it was taken" % path)
    return json.loads(data)


def drop(req):
    guard = listeners.Listener(req.unit, req.service.port).problem
    was_on = ours(current_folder(req.unit), req.service.name)
    if was_on and not guard():
        _off(req.service, guard)
    return protocol.TrafficDropped(removed=_remove_samples(req.service.name), dump_was_on=was_on)
