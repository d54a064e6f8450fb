"""Faults on request: around each action of a batch, whether the sandbox asked for this kind of
action to fail, or for the agent to die there (a cut-off switch), so that every kind's undo can be
tried on a real host.  The request is layout.FAULTS, {"kind", "nth" (default 1), "how": "fail" |
"kill" (before the action) | "kill-after" (once it is done)}: root's own regular file in /run,
which no one else can write; it is consumed when it fires."""
import json
import os
import signal
import stat

from specops.agent.host import ActionError
from specops.layout import FAULTS

_seen = {}  # kind → how many actions of it this agent has begun


def at(kind):
    """Called before an action of `kind` runs: fail it, or die, if asked."""
    _seen[kind] = _seen.get(kind, 0) + 1
    _fire(kind, ("fail", "kill"))


def after(kind):
    """Called once an action of `kind` is done: die, if asked."""
    _fire(kind, ("kill-after",))


def _fire(kind, hows):
    try:  # never through a link, and only root's own regular file that no one else can write
        fd = os.open(FAULTS, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    with os.fdopen(fd) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return
        try:
            asked = json.load(f)
        except ValueError:
            return
    if not isinstance(asked, dict) or asked.get("kind") != kind or _seen.get(kind) != asked.get("nth", 1) \
            or asked.get("how", "fail") not in hows:
        return
    os.unlink(FAULTS)
    if asked.get("how", "fail") != "fail":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ActionError("%s failed: a fault injected on request (%s)" % (kind, FAULTS))
