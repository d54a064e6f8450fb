"""The messages between the controller and the agent on a host: one place, both sides.

The agent carries this package in its zip.  `wire` holds the rules (a JSON object per
message, named by its ``kind``; unknown kinds and missing or unexpected fields refused in
one line), `parts` the shared parts and the actions of a batch, `requests` the requests
with the Result each is answered with, `routing` those of a rolling deploy behind a router,
`window` the end of a GPU window's job.
"""
from .parts import *  # noqa: F401,F403
from .requests import *  # noqa: F401,F403
from .routing import *  # noqa: F401,F403
from .window import *  # noqa: F401,F403
from .wire import (AgentError, Message, ProtocolError, action_kinds, decode_action, decode_request,  # noqa: F401
                   decode_result, encode, fields_of, replace, request_kinds, to_dict)

REQUEST_KINDS = request_kinds()
ACTION_KINDS = action_kinds()
