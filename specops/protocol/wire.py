"""The wire rules: how a protocol message becomes JSON and back, refusing what is not ours.

Both sides import this module (the agent carries it in its zip).  A request is one
SSH round trip: the controller sends ``encode(request)`` as JSON on the agent's stdin,
and the agent answers ``{"ok": true, "result": {...}}`` (the request's ``Result``
type) or ``{"ok": false, "error": "one line"}``.  On the wire every request and every
action is a JSON object whose ``kind`` names its class here; ``decode`` refuses an
unknown kind, a missing field or an unexpected one with a one-line ProtocolError that
names it.  Any request may also carry ``unlock``: the lock token to give back when it
ends, so a run's last call needs no round trip of its own; and ``lock``: the token of the
run's lock, which must still hold it (its lease is renewed) for the request to run.

Standard library only; runs on the host's python3 (3.8+).
"""
from __future__ import annotations

if False:  # annotations are never evaluated (importing typing costs the agent ~5 ms a call)
    from typing import Any, Dict  # noqa: F401

# Messages are plain classes built here, not dataclasses: the agent starts on every call, and
# importing dataclasses (with inspect) and generating their methods cost it ~40 ms a call.


class ProtocolError(ValueError):
    """A message that is not one of ours: unknown kind, missing or unexpected field."""


class AgentError(Exception):
    """The agent refused or failed a request; the message is its one line."""


class Factory:
    """A field default made fresh for each message (a list, a dict, a nested message)."""

    def __init__(self, make):
        self.make = make


LIST, DICT = Factory(list), Factory(dict)
MISSING = object()
_CLASSES: Dict[str, type] = {}
_REQUESTS: Dict[str, type] = {}
_ACTIONS: Dict[str, type] = {}


class Message:
    """Base of every message: fields from the class's annotations, in order, defaults from its
    attributes.  Construct by position or by name; compare by value."""
    FIELDS: tuple = ()  # ((name, annotation, default), ...)

    def __init__(self, *args, **kwargs):
        if len(args) > len(self.FIELDS):
            raise TypeError("%s takes at most %d fields" % (type(self).__name__, len(self.FIELDS)))
        for (name, _, default), value in zip(self.FIELDS, args):
            kwargs[name] = value
        for name, _, default in self.FIELDS:
            if name in kwargs:
                value = kwargs.pop(name)
            elif default is MISSING:
                raise TypeError("%s: missing field %r" % (type(self).__name__, name))
            else:
                value = default.make() if isinstance(default, Factory) else default
            setattr(self, name, value)
        if kwargs:
            raise TypeError("%s: unexpected field %r" % (type(self).__name__, sorted(kwargs)[0]))

    def __eq__(self, other):
        return type(other) is type(self) and to_dict(self) == to_dict(other)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (n, getattr(self, n)) for n, _, _ in self.FIELDS))


def message(cls):
    """Make `cls` a Message: its annotated attributes, in order, are its fields."""
    fields = tuple((name, ann, cls.__dict__.get(name, MISSING))
                   for name, ann in cls.__dict__.get("__annotations__", {}).items())
    for name, _, _ in fields:
        if name in cls.__dict__:
            delattr(cls, name)
    cls = type(cls.__name__, (Message,), {**{k: v for k, v in cls.__dict__.items()
                                             if k not in ("__dict__", "__weakref__")}, "FIELDS": fields})
    _CLASSES[cls.__name__] = cls
    return cls


def _message(registry: Dict[str, type], kind: str, **attrs: Any):
    def wrap(cls):
        cls = message(cls)
        cls.KIND = kind
        for name, value in attrs.items():
            setattr(cls, name, value)
        registry[kind] = cls
        return cls
    return wrap


def request(kind: str, changes_host: bool = False):
    """A request kind: one round trip, answered with ``cls.Result``.  `changes_host`: the agent
    runs it only for a run that holds the host lock (``lock`` in its envelope): a controller that
    forgot the lock cannot change the host."""
    return _message(_REQUESTS, kind, CHANGES_HOST=changes_host)


def action(kind: str, phase: str):
    """An action kind, as an apply (or check) batch carries it, and the phase of a batch it runs
    in (parts.PHASES)."""
    return _message(_ACTIONS, kind, PHASE=phase)


def encode(msg: Any, **envelope: Any) -> dict:
    """A message as its wire dict: its fields, nested messages as dicts, plus ``kind``."""
    out = {"kind": msg.KIND} if hasattr(msg, "KIND") else {}
    out.update(to_dict(msg))
    out.update({k: v for k, v in envelope.items() if v is not None})
    return out


def to_dict(msg: Any) -> dict:
    """A message's fields as plain data (nested messages encoded with their kind)."""
    return {name: _plain(getattr(msg, name)) for name, _, _ in msg.FIELDS}


def replace(msg: Any, **changes: Any) -> Any:
    """A copy of `msg` with some fields changed."""
    return type(msg)(**{**{n: getattr(msg, n) for n, _, _ in msg.FIELDS}, **changes})


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return encode(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _decoder(ann: str):
    """How to decode a field from its annotation: nested messages, lists of them, actions."""
    ann = ann.replace(" ", "")
    if ann.startswith("Optional[") and ann.endswith("]"):
        inner = _decoder(ann[9:-1])
        return inner and (lambda v, what: None if v is None else inner(v, what))
    if ann.startswith("List[") and ann.endswith("]"):
        item = ann[5:-1]
        if item == "Action":
            return lambda v, what: [decode_action(x, "%s[%d]" % (what, i)) for i, x in enumerate(v or [])]
        inner = _decoder(item)
        return inner and (lambda v, what: [inner(x, "%s[%d]" % (what, i)) for i, x in enumerate(v or [])])
    cls = _CLASSES.get(ann)
    return cls and (lambda v, what: fields_of(cls, v, what))


def fields_of(cls: type, data: Any, what: str) -> Any:
    """Build a message from a wire dict, refusing missing and unexpected fields."""
    if not isinstance(data, dict):
        raise ProtocolError("%s: expected an object, got %s" % (what, type(data).__name__))
    known = {name for name, _, _ in cls.FIELDS}
    extra = sorted(set(data) - known - {"kind"})
    if extra:
        raise ProtocolError("%s: unexpected field %r" % (what, extra[0]))
    values = {}
    for name, ann, default in cls.FIELDS:
        if name in data:
            decode = _decoder(ann)
            values[name] = decode(data[name], "%s.%s" % (what, name)) if decode else data[name]
        elif default is MISSING:
            raise ProtocolError("%s: missing field %r" % (what, name))
    return cls(**values)


# Set by specops.protocol (which holds at first only a no-op's messages): loads the rest, and
# with them every kind.  A callback, not an import of the package: that would be a circle.
load_all = None


def _registered(registry: Dict[str, type], kind: Any) -> bool:
    """Whether `kind` is one of the registry's, every message loaded first when it is not yet."""
    if kind not in registry and load_all is not None:
        load_all()
    return kind in registry


def _decode_kind(registry: Dict[str, type], family: str, data: Any, what: str) -> Any:
    kind = data.get("kind") if isinstance(data, dict) else None
    if not _registered(registry, kind):
        raise ProtocolError("%s: unknown %s kind %r (known: %s)" % (what, family, kind, ", ".join(sorted(registry))))
    return fields_of(registry[kind], data, "%s %s" % (family, kind) if what == family else "%s (%s)" % (what, kind))


def decode_request(data: Any) -> Any:
    """The request in a wire dict (the envelope's ``unlock`` is read by the caller)."""
    body = dict(data) if isinstance(data, dict) else data
    if isinstance(body, dict):
        body.pop("unlock", None)
        body.pop("lock", None)
    return _decode_kind(_REQUESTS, "request", body, "request")


def decode_action(data: Any, what: str = "action") -> Any:
    return _decode_kind(_ACTIONS, "action", data, what)


def decode_result(request_msg: Any, answer: Any) -> Any:
    """The agent's answer to `request_msg`: its Result, or AgentError with the agent's line."""
    if not isinstance(answer, dict) or "ok" not in answer:
        raise ProtocolError("answer to %s: not an envelope" % request_msg.KIND)
    if not answer["ok"]:
        raise AgentError(answer.get("error") or "the agent failed without saying why")
    return fields_of(request_msg.Result, answer.get("result"), "answer to %s" % request_msg.KIND)


def request_kinds():
    """The request kinds registered (every one once specops.protocol.load_all has run)."""
    return tuple(sorted(_REQUESTS))


def changes_host(kind) -> bool:
    """Whether a request of this kind (a wire dict's ``kind``) needs the host lock."""
    return isinstance(kind, str) and _registered(_REQUESTS, kind) and _REQUESTS[kind].CHANGES_HOST


def action_kinds():
    """The action kinds registered (every one once specops.protocol.load_all has run)."""
    return tuple(sorted(_ACTIONS))
