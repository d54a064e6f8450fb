"""The messages between the controller and the agent on a host: one place, both sides.

The agent carries this package in its zip.  `wire` holds the rules (a JSON object per
message, named by its ``kind``; unknown kinds and missing or unexpected fields refused in
one line), `parts` the shared parts and `actions` the actions of a batch.  The requests, each with
the Result it is answered with, by job: `converge` (probe, apply, check, verify), `lock`,
`lifecycle` (stop, start), `releases` (record, list, undo, rollback, perf), `peer` (a copy
between hosts), `bench` (spec-bench and its baseline), `routing` (a rolling deploy behind a
router), `window` (the end of a GPU window's job), `textfile` (node_exporter's textfile) and
`traffic` (a sample of what a service serves, from its request dump).
"""
from .parts import *  # noqa: F401,F403
from .actions import *  # noqa: F401,F403
from .converge import *  # noqa: F401,F403
from .lock import *  # noqa: F401,F403
from .lifecycle import *  # noqa: F401,F403
from .releases import *  # noqa: F401,F403
from .peer import *  # noqa: F401,F403
from .bench import *  # noqa: F401,F403
from .routing import *  # noqa: F401,F403
from .window import *  # noqa: F401,F403
from .textfile import *  # noqa: F401,F403
from .traffic import *  # noqa: F401,F403
from .wire import (AgentError, Message, ProtocolError, action_kinds, changes_host, decode_action,  # noqa: F401
                   decode_request, decode_result, encode, fields_of, replace, request_kinds, to_dict)

REQUEST_KINDS = request_kinds()
ACTION_KINDS = action_kinds()
