"""The host lock's round trips after it is taken by a Probe: renewing its lease, giving it back."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict, List, Optional  # noqa: F401

from .wire import LIST, message, request


@message
class RenewResult:
    """Whether the token still holds the lock (its lease renewed), and who holds it if not."""
    held: bool
    holder: Optional[Dict[str, Any]] = None


@request("renew")
class Renew:
    """Renew the lease of the lock `token` holds (a long run does this while it waits)."""
    token: str
    Result = RenewResult


@message
class UnlockResult:
    """Whether the token still held the lock and gave it back; `running`: the pids of commands
    the run started that had not ended after lock.RELEASE_WAIT (the lock is kept then; 0 is a
    pid /proc did not show)."""
    released: bool
    running: List[int] = LIST


@request("unlock")
class Unlock:
    """Give the lock back, if `token` still holds it."""
    token: str
    Result = UnlockResult
