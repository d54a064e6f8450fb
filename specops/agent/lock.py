"""The host lock: one specops run changes a host at a time.

mkdir is atomic, so whoever creates LOCK_DIR holds the lock; holder.json inside says who
(shown to anyone refused), carries the token that proves it is ours, and a lease: every
request of the run renews it, and a lock whose lease ran out (its controller died) is taken
over by the next run.  Every change to the lock happens under an flock on LOCK_GUARD.  Taking over (expired, or --break-lock) is a compare-and-swap
on the holder's token: the lock directory is renamed aside, and kept only if it is still
the one whose holder was judged, so two breakers never both hold it.  A run whose lock was
taken over is refused at its next request.
"""
import fcntl
import json
import os
import time

from specops import protocol
from specops.agent.host import clean
from specops.layout import LOCK_DIR, LOCK_GUARD, LOCK_HOLDER, LOCK_LEASE


def guarded(work):
    """Run `work` holding an flock on LOCK_GUARD: acquire, take-over, renew and release never
    interleave (a renew racing a take-over must not win the lock back)."""
    def run(*args, **kwargs):
        fd = os.open(LOCK_GUARD, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return work(*args, **kwargs)
        finally:
            os.close(fd)
    run.__doc__ = work.__doc__
    return run


def _read(directory=None):
    try:
        with open(os.path.join(directory or LOCK_DIR, "holder.json")) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def shown(holder):
    """The holder as people see it: no token, no control characters."""
    if holder is None:
        return {"who": "unknown (no holder.json)"}
    return {k: clean(str(v)) for k, v in holder.items() if k in ("who", "pid", "task", "since")}


def _write(holder):
    tmp = "%s.%d.tmp" % (LOCK_HOLDER, os.getpid())
    with open(tmp, "w") as f:
        json.dump(holder, f)
    os.rename(tmp, LOCK_HOLDER)


def _expired(holder):
    if holder is None:  # a lock without a holder: its maker died between mkdir and the write
        try:
            return time.time() - os.stat(LOCK_DIR).st_mtime > 10
        except OSError:
            return True
    try:
        return time.time() > float(holder["renewed"]) + float(holder.get("lease", LOCK_LEASE))
    except (KeyError, TypeError, ValueError):
        return True


def _remove(directory=None):
    directory = directory or LOCK_DIR
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass
    try:
        os.rmdir(directory)
    except OSError:
        pass


def _take(holder):
    try:
        os.mkdir(LOCK_DIR, 0o700)
    except FileExistsError:
        return False
    _write(dict(protocol.to_dict(holder), renewed=time.time()))
    return True


@guarded
def acquire(holder, take_over=False):
    """{acquired: True, token, took_over?} or {acquired: False, holder}.  `take_over` (--break-lock)
    takes the lock from a live holder; an expired one is taken over anyway."""
    if _take(holder):
        return {"acquired": True, "token": holder.token}
    seen = _read()
    expired = _expired(seen)
    if not (take_over or expired):
        return {"acquired": False, "holder": shown(seen)}
    aside = "%s.taken-%s" % (LOCK_DIR, os.urandom(4).hex())
    try:
        os.rename(LOCK_DIR, aside)
    except FileNotFoundError:  # released meanwhile
        return {"acquired": True, "token": holder.token} if _take(holder) else {"acquired": False,
                                                                               "holder": shown(_read())}
    moved = _read(aside)
    if (moved or {}).get("token") != (seen or {}).get("token"):  # not the holder we judged: put it back
        try:
            os.rename(aside, LOCK_DIR)
        except OSError:
            _remove(aside)
        return {"acquired": False, "holder": shown(moved)}
    _remove(aside)
    if not _take(holder):
        return {"acquired": False, "holder": shown(_read())}
    reason = "its lease expired" if expired else "--break-lock"
    return {"acquired": True, "token": holder.token, "took_over": dict(shown(seen), reason=reason)}


@guarded
def check(token):
    """Does `token` still hold the lock?  If so its lease is renewed.  (held, holder)"""
    holder = _read()
    if holder is None or holder.get("token") != token:
        return False, shown(holder) if os.path.isdir(LOCK_DIR) else None
    holder["renewed"] = time.time()
    _write(holder)
    return True, None


def refusal(holder):
    if holder is None:
        return "the host lock this run held is gone (taken over and released); this run stops here"
    return "the host lock was taken over by %s (pid %s, task %s); this run stops here" % (
        holder.get("who", "?"), holder.get("pid", "?"), holder.get("task", "?"))


@guarded
def release(token):
    """Give the lock back if `token` holds it."""
    holder = _read()
    mine = token is not None and holder is not None and holder.get("token") == token
    if mine:
        _remove()
    return mine


def peek():
    """Is the lock held, and by whom (for status and facts)."""
    if not os.path.isdir(LOCK_DIR):
        return {"held": False}
    holder = _read()
    return {"held": True, "holder": shown(holder), "expired": _expired(holder)}


def unlock(req):
    """Answer a protocol.Unlock."""
    return protocol.UnlockResult(released=release(req.token))


def renew(req):
    """Answer a protocol.Renew."""
    held, holder = check(req.token)
    return protocol.RenewResult(held=held, holder=holder)
