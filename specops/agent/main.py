"""The agent's entry point: decode one request, run it, answer, give the lock back.

Each request kind maps to the function that answers it; the module holding it is
imported only when that kind is asked for, so a probe compiles only what a probe needs.
"""
import importlib
import json
import sys

from specops import protocol
from specops.agent.host import ActionError, die_with_connection

HANDLERS = {
    "probe": ("probe", "probe"),
    "apply": ("stage", "apply"),
    "check": ("stage", "check"),
    "verify": ("service_http", "verify"),
    "peek": ("service_http", "peek"),
    "unlock": ("lock", "unlock"),
    "stop": ("units", "stop"),
    "start": ("units", "start"),
    "release_record": ("releases", "record"),
    "releases": ("releases", "releases"),
    "undo": ("releases", "undo"),
    "rollback": ("releases", "rollback"),
}
assert set(HANDLERS) == set(protocol.REQUEST_KINDS), "every request kind has exactly one handler"
QUICK = ("probe", "peek", "releases", "unlock")  # read-only and short: no need to die with sshd


def answer(raw, on_kind=None):
    """The wire answer (a dict) to one wire request (JSON text); `on_kind(kind)` is told what
    was asked before the work starts."""
    try:
        data = json.loads(raw)
    except ValueError as e:
        return {"ok": False, "error": "request is not JSON: %s" % e}
    token = data.get("unlock") if isinstance(data, dict) else None
    if on_kind:
        on_kind(data.get("kind") if isinstance(data, dict) else None)
    try:
        req = protocol.decode_request(data)
        module, function = HANDLERS[req.KIND]
        handler = getattr(importlib.import_module("specops.agent." + module), function)
        return {"ok": True, "result": protocol.encode(handler(req))}
    except (protocol.ProtocolError, ActionError) as e:
        return {"ok": False, "error": str(e)}
    finally:
        if token:  # the last call of a run gives the lock back in the same round trip
            from specops.agent.lock import release
            release(token)


def main(raw=None):
    result = answer(sys.stdin.read() if raw is None else raw,
                    on_kind=lambda kind: die_with_connection(parent_death=kind not in QUICK))
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
