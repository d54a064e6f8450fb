"""The host lock: one specops run changes a host at a time.

mkdir is atomic, so whoever creates LOCK_DIR holds the lock; holder.json inside says who
(shown to anyone refused), carries the token that proves it is ours, and a lease: every
request of the run renews it, and a lock whose lease ran out (its controller died) is taken
over by the next run.  Every change to the lock happens under an flock on LOCK_GUARD.  Taking over (expired, or
--break-lock) is a compare-and-swap
on the holder's token: the lock directory is renamed aside, and kept only if it is still
the one whose holder was judged, so two breakers never both hold it.  A run whose lock was
taken over is refused at its next request.

A command the agent started (a download, rsync, pip) holds a shared flock on CHILDREN_LOCK for as
long as it lives (agent/host.py).  The lock is given back only once none is left (an
interrupted run's agent is still stopping them when the controller asks), and is neither taken
nor taken over while one of an earlier run still runs: two runs never write the same files.
"""

import fcntl
import os
import time

from specops import protocol
from specops.agent.host import clean
from specops.agent.lean import dumps, load
from specops.layout import CHILD_GRACE, CHILDREN_LOCK, LOCK_DIR, LOCK_GUARD, LOCK_HOLDER, LOCK_LEASE

RELEASE_WAIT = 2 * CHILD_GRACE  # how long a give-back waits for the run's commands to be gone
# how long a take waits for them: the agent of a run that has just given the lock back may still be
# exiting (spec-tune --apply deploys right after its own run)
ACQUIRE_WAIT = 3.0


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
            data = load(f)
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
        f.write(dumps(holder))
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


def running(wait=0.0):
    """The pids of the commands an agent started that are still running (waiting up to `wait`
    seconds for there to be none): the holders of CHILDREN_LOCK's flock."""
    fd = os.open(CHILDREN_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return []
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return _holders(CHILDREN_LOCK) or [0]  # 0: a holder /proc did not show
                time.sleep(0.1)
    finally:
        os.close(fd)


def _holders(path):
    """Pids of the processes that have `path` open (/proc/locks names the process that took a
    flock, the agent, not the command that inherited it)."""
    pids = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            if any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) == path for fd in os.listdir("/proc/%s/fd" % pid)):
                pids.add(int(pid))
        except OSError:
            continue
    return sorted(pids)


@guarded
def acquire(holder, take_over=False):
    """{acquired: True, token, took_over?} or {acquired: False, holder, running?}.  `take_over`
    (--break-lock) takes the lock from a live holder; an expired one is taken over anyway; never
    while a command an earlier run started still runs, but with --break-lock (said: still_running)."""
    left = running(0 if take_over else ACQUIRE_WAIT)
    if left and not take_over:
        return {"acquired": False, "holder": shown(_read()), "running": left}
    got = _acquire(holder, take_over)
    if left and got["acquired"]:  # --break-lock: the one way past a command that will not end
        got["still_running"] = left
    return got


def _acquire(holder, take_over):
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


def release(token):
    """Give the lock back if `token` holds it, once the commands its run started are gone.
    (released, pids still running)."""
    left = running(RELEASE_WAIT)  # outside the guard: the holder's own renewals may go on meanwhile
    return (_release(token) if not left else False), left


@guarded
def _release(token):
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
    released, left = release(req.token)
    return protocol.UnlockResult(released=released, running=left)


def renew(req):
    """Answer a protocol.Renew."""
    held, holder = check(req.token)
    return protocol.RenewResult(held=held, holder=holder)
