"""The host lock: one specops run changes a host at a time.

mkdir is atomic, so whoever creates LOCK_DIR holds the lock; holder.json inside says
who (shown to anyone refused) and carries the token that proves it is ours.
"""
import json
import os

from specops import protocol
from specops.agent.host import clean
from specops.layout import LOCK_DIR, LOCK_HOLDER


def _holder():
    try:
        with open(LOCK_HOLDER) as f:
            data = json.load(f)
        return {k: clean(str(v)) for k, v in data.items() if k != "token"}
    except (OSError, ValueError):
        return {"who": "unknown (no holder.json)"}


def _token():
    try:
        with open(LOCK_HOLDER) as f:
            return json.load(f).get("token")
    except (OSError, ValueError, AttributeError):
        return None


def acquire(holder, take_over=False):
    """{acquired: True, token} or {acquired: False, holder}.  `take_over` breaks a lock whose
    run is gone (--break-lock)."""
    if take_over:
        _remove()
    try:
        os.mkdir(LOCK_DIR, 0o700)
    except FileExistsError:
        return {"acquired": False, "holder": _holder()}
    with open(LOCK_HOLDER, "w") as f:
        json.dump(protocol.to_dict(holder), f)
    return {"acquired": True, "token": holder.token}


def release(token):
    """Give the lock back if `token` holds it."""
    mine = token is not None and _token() == token
    if mine:
        _remove()
    return mine


def _remove():
    for path, remove in ((LOCK_HOLDER, os.unlink), (LOCK_DIR, os.rmdir)):
        try:
            remove(path)
        except OSError:
            pass


def peek():
    """Is the lock held, and by whom (for status and facts)."""
    if not os.path.isdir(LOCK_DIR):
        return {"held": False}
    return {"held": True, "holder": _holder()}


def unlock(req):
    """Answer a protocol.Unlock."""
    return protocol.UnlockResult(released=release(req.token))
