"""The messages between the controller and the agent on a host: one place, both sides.

The agent carries this package in its zip.  `wire` holds the rules (a JSON object per
message, named by its ``kind``; unknown kinds and missing or unexpected fields refused in
one line), `parts` the shared parts and `actions` the actions of a batch.  The requests, each with
the Result it is answered with, by job: `converge` (probe, apply, check, verify), `lock`,
`lifecycle` (stop, start), `releases` (record, list, undo, rollback, perf), `peer` (a copy
between hosts), `bench` (spec-bench and its baseline), `routing` (a rolling deploy behind a
router), `window` (the end of a GPU window's job), `textfile` (node_exporter's textfile) and
`traffic` (a sample of what a service serves, from its request dump).

The agent starts on every call, and building the messages' classes costs it (~2 ms of a host's
CPU for those a no-op never sends): the package holds at first `converge`'s (probe, apply, check,
verify, peek) and the parts and actions they are made of; the other submodules (LATER) are loaded
when a name the package does not hold yet is asked of it (PEP 562), and by wire when it meets a kind
it does not know yet.
"""
from .parts import *  # noqa: F401,F403
from .actions import *  # noqa: F401,F403
from .converge import *  # noqa: F401,F403
from . import wire as _wire
from .wire import (AgentError, Message, ProtocolError, action_kinds, changes_host, decode_action,  # noqa: F401
                   decode_request, decode_result, encode, fields_of, replace, request_kinds, to_dict)

LATER = ("lock", "lifecycle", "releases", "peer", "bench", "routing", "window", "textfile", "traffic")


def load_all():
    """Every LATER submodule, its names put in the package as `from .x import *` puts them (none
    defines __all__), then every kind: REQUEST_KINDS and ACTION_KINDS."""
    space = globals()
    if "REQUEST_KINDS" in space:  # set last: everything is loaded
        return
    for name in LATER:
        module = __import__("%s.%s" % (__name__, name), fromlist=["*"])
        space.update((k, v) for k, v in vars(module).items() if not k.startswith("_"))
    space["ACTION_KINDS"] = action_kinds()
    space["REQUEST_KINDS"] = request_kinds()


_wire.load_all = load_all  # a kind wire does not know yet is looked for in every message


def __getattr__(name):
    """A name the package does not hold yet (PEP 562): a LATER submodule's, or the kinds."""
    if not name.startswith("__"):  # (what copy, pickle or inspect look for is not ours)
        load_all()
        if name in globals():
            return globals()[name]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
