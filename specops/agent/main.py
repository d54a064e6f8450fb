"""The agent's entry point: serve a run's requests in order; for each, decode it, run it,
answer, and give the lock back when asked.

Each request kind maps to the function that answers it; the module holding it is
imported only when that kind is first asked for.
"""
import sys

from specops import protocol
from specops.agent import children
from specops.agent.host import ActionError, die_with_connection, run_cleanups
from specops.agent.lean import dumps, loads

HANDLERS = {
    "probe": ("converge.probe", "probe"),
    "apply": ("converge.stage", "apply"),
    "check": ("converge.stage", "check"),
    "verify": ("services.service_http", "verify"),
    "peek": ("services.service_http", "peek"),
    "unlock": ("lock", "unlock"),
    "renew": ("lock", "renew"),
    "stop": ("services.units", "stop"),
    "start": ("releases", "start"),
    "release_record": ("releases", "record"),
    "releases": ("releases", "releases"),
    "undo": ("rollback", "undo"),
    "rollback": ("rollback", "rollback"),
    "peer_key": ("weights.peercopy", "key"),
    "peer_copy": ("weights.peercopy", "copy"),
    "spec_bench": ("bench.specbench", "run"),
    "baseline_start": ("bench.baseline", "start"),
    "startup": ("bench.baseline", "startup"),
    "traffic_capture": ("bench.traffic", "capture"),
    "traffic_drop": ("bench.traffic", "drop"),
    "perf_record": ("releases", "record_perf"),
    "router_members": ("services.routing", "members"),
    "router_remove": ("services.routing", "remove"),
    "router_add": ("services.routing", "add"),
    "worker_idle": ("services.routing", "idle"),
    "end_job": ("services.window", "end"),
    "textfile": ("textfile", "write"),
}
# Every request kind has exactly one handler: tests/test_protocol.py checks it (here, it would load
# every protocol module on every call).


def answer(raw):
    """The wire answer (a dict) to one wire request (JSON text)."""
    try:
        data = loads(raw)
    except ValueError as e:
        return {"ok": False, "error": "request is not JSON: %s" % e}
    token = data.get("unlock") if isinstance(data, dict) else None
    held_by = data.get("lock") if isinstance(data, dict) else None
    if isinstance(data, dict) and data.get("kind") == "unlock":
        token = None  # its handler gives the lock back, and answers whether it did
    children.state.update(locked=bool(held_by), busy=True)
    try:
        if held_by:  # the run's lock must still be its own: a run taken over stops here
            from specops.agent import lock
            held, holder = lock.check(held_by)
            if not held:
                token = None
                return {"ok": False, "error": lock.refusal(holder)}
        if isinstance(data, dict) and protocol.changes_host(data.get("kind")) and not held_by:  # whoever sent it
            return {"ok": False, "error": "%s changes the host: it runs only for a run that holds the host lock"
                                          % data["kind"]}
        req = protocol.decode_request(data)
        return {"ok": True, "result": protocol.encode(handler(req.KIND)(req))}
    except (protocol.ProtocolError, ActionError) as e:
        return {"ok": False, "error": str(e)}
    except Exception as e:  # a bug, or a failure nobody foresaw: still one line, in the envelope
        kind = data.get("kind") if isinstance(data, dict) else None
        return {"ok": False, "error": "%s failed on the host: %s: %s" % (kind, type(e).__name__, e)}
    finally:
        children.state["busy"] = False
        if isinstance(data, dict) and protocol.changes_host(data.get("kind")):
            _forget_units()
        if token:  # the last call of a run gives the lock back in the same round trip
            from specops.agent.lock import release
            release(token)


def handler(kind):
    """The function that answers a request kind, its module imported when first asked for."""
    module, function = HANDLERS[kind]
    name = "specops.agent." + module
    __import__(name)  # importlib.import_module's work, without importing importlib's Python layer
    return getattr(sys.modules[name], function)


def _forget_units():
    """What this agent read of units is not what they are after a request that changed the host."""
    probe = sys.modules.get("specops.agent.converge.probe")
    if probe:
        probe.SEEN.clear()


def serve(inp, out):
    """Answer framed requests (length line, JSON) from `inp` with framed answers on `out`, in
    order, until the controller closes the session."""
    die_with_connection(out)
    try:
        while True:
            head = inp.readline()
            if not head.strip():
                return
            raw = inp.read(int(head))
            data = dumps(answer(raw.decode())).encode()
            out.write(b"%d\n%s" % (len(data), data))
            out.flush()
    finally:
        run_cleanups()
