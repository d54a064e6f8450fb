"""The request that ends a GPU window's job: the job runs on the controller's terminal channel
inside a transient scope that root made (its name: layout.WINDOW_PREFIX and 16 hex digits), and
whatever of it still runs when the window closes is stopped before the services start again."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import List  # noqa: F401

from .parts import Process  # noqa: F401
from .wire import LIST, message, request


@message
class EndJobResult:
    """The processes of the job that were still running (now stopped), and any left after."""
    ended: List[Process] = LIST
    left: List[Process] = LIST


@request("end_job", changes_host=True)
class EndJob:
    """Stop the window's job scope `scope` (SIGTERM, SIGKILL after WINDOW_STOP_SEC), if it runs."""
    scope: str
    Result = EndJobResult
