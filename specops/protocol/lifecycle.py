"""Stopping a service's units with proof of free GPU memory, and starting them again."""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Dict, List, Optional  # noqa: F401

from .parts import Process, ServiceCheck, UnitRef  # noqa: F401
from .wire import DICT, LIST, message, request


@message
class StopReport:
    """One unit stopped: leftovers `killed`, GPU memory freed per GPU index, what is `left`
    on the GPUs (attributed to no unit, or not killable), and the failures that make stop fail."""
    name: str
    seconds: float
    killed: List[Process] = LIST
    freed_mib: Dict[str, Optional[int]] = DICT
    left: List[Process] = LIST
    failures: List[str] = LIST
    # seconds systemctl stop waited when the server outlived TimeoutStopSec and systemd killed it
    timed_out: Optional[float] = None
    # systemd's Result when the unit became "failed" during this stop and was left so (a single-node
    # unit whose run ended with a failure as it was stopped, a crash; or one killed at its timeout)
    left_failed: Optional[str] = None
    # systemd's Result when the unit was already "failed" before this stop, and stays so: a failure
    # that was not the stop's (a rank that lost its peer earlier, a crash)
    failed_before: Optional[str] = None
    # its UnitFileState after the stop: "enabled" starts it again at boot, "disabled" does not
    enabled: Optional[str] = None


@message
class StopResult:
    """A report per stopped unit, and each GPU's memory in use afterwards (None: not reported)."""
    services: List[StopReport]
    gpus: Dict[str, Optional[int]] = DICT


@request("stop", changes_host=True)
class Stop:
    """Stop units, kill what of their runs still lives, prove their GPU memory free.  `others`:
    the host's other units, whose processes may keep holding GPU memory.  `disable`: also
    disable them, so that a reboot does not start them again."""
    services: List[UnitRef]
    others: List[str] = LIST
    disable: bool = False
    Result = StopResult


@message
class StartResult:
    """The units started, and how the current release says to verify them (None before any)."""
    started: List[str]
    verify: Optional[List[ServiceCheck]] = None


@request("start", changes_host=True)
class Start:
    """Start units again (after stop or a GPU window), accounting for leftovers first."""
    services: List[UnitRef]
    Result = StartResult
