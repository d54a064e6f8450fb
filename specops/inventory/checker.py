"""The inventory's small type language (Enum, Pattern, Checked, MapOf, Req, OneOf) and its
checker, which names file and key path on the first mismatch.  The vocabulary written in it is
schema.py's and the roles'."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageError


@dataclass(frozen=True)
class Enum:
    values: tuple


@dataclass(frozen=True)
class Pattern:
    """A string matching `regex`; `rule` says what is allowed."""
    regex: str
    rule: str


@dataclass(frozen=True)
class Checked:
    """A string `test` accepts; `rule` says what is allowed.  A refused value is not shown: it may
    hold a password (an index URL's)."""
    test: Callable[[str], bool]
    rule: str


@dataclass(frozen=True)
class MapOf:
    """A mapping with free keys, each value of one type."""
    value: Any


@dataclass(frozen=True)
class Req:
    """A key that must be present."""
    schema: Any


@dataclass(frozen=True)
class OneOf:
    """Any one of `options` (a mapping's own problems are named when the value is a mapping)."""
    options: tuple
    rule: str


ANY = object()
NUMBER = (int, float)

_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", float: "a number",
               NUMBER: "a number", list: "a list", dict: "a mapping"}


def check(value: Any, schema: Any, file: str, where: str) -> None:
    """Raise UsageError('file: key.path: problem') on the first mismatch."""
    def fail(problem: str) -> None:
        raise UsageError(f"{file}: {where or '(top)'}: {problem}")

    if isinstance(schema, Req):
        schema = schema.schema
    if schema is ANY:
        return
    if isinstance(schema, OneOf):
        errors = []
        for option in schema.options:
            try:
                return check(value, option, file, where)
            except UsageError as e:
                errors.append((isinstance(option, dict), e))
        raise next((e for is_map, e in errors if is_map and isinstance(value, dict)), None) or \
            UsageError(f"{file}: {where or '(top)'}: {schema.rule}, not {value!r}")
    if isinstance(schema, Enum):
        if value not in schema.values:
            fail(f"must be one of {', '.join(map(str, schema.values))}, not {value!r}")
    elif isinstance(schema, Pattern):
        if not isinstance(value, str) or not re.fullmatch(schema.regex, value):
            fail(f"{schema.rule}, not {value!r}")
    elif isinstance(schema, Checked):
        if not isinstance(value, str) or not schema.test(value):
            fail(f"{schema.rule} (not shown: it may hold a password)")
    elif isinstance(schema, MapOf):
        if not isinstance(value, dict):
            fail(f"must be a mapping, not {_kind(value)}")
        for k, v in value.items():
            check(v, schema.value, file, f"{where}.{k}")
    elif isinstance(schema, dict):
        if not isinstance(value, dict):
            fail(f"must be a mapping, not {_kind(value)}")
        for k, v in value.items():
            if k not in schema:
                raise UsageError(f"{file}: {key_path(where, k)}: unknown key{did_you_mean(k, schema)}")
            check(v, schema[k], file, key_path(where, k))
        for k, sub in schema.items():
            if isinstance(sub, Req) and k not in value:
                raise UsageError(f"{file}: {key_path(where, k)}: required key is missing")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            fail(f"must be a list, not {_kind(value)}")
        for i, item in enumerate(value):
            check(item, schema[0], file, f"{where}[{i}]")
    else:
        # bool is an int in Python; a YAML `yes` must not pass for a port.
        ok = isinstance(value, schema) and not (isinstance(value, bool) and schema is not bool)
        if not ok:
            fail(f"must be {_TYPE_NAMES.get(schema, schema)}, not {_kind(value)}")


def key_path(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def did_you_mean(key: Any, known, prefix: str = "") -> str:
    """' (did you mean 'x'?)' naming the known key closest to a mistyped one, or ''.  A `prefix`
    they all share (ansible_) is left out of the likeness: it would make every pair look alike."""
    word = str(key).replace("-", "_")
    names = {k[len(prefix):]: k for k in known if k.startswith(prefix)}
    close = difflib.get_close_matches(word[len(prefix):] if word.startswith(prefix) else word, list(names), n=1)
    return f" (did you mean {names[close[0]]!r}?)" if close else ""


def _kind(value: Any) -> str:
    if value is None:
        return "empty"
    shown = "" if isinstance(value, str) and "@" in value else f" ({value!r})"[:60]  # a URL's credentials
    return {str: "a string", int: "an integer", bool: "a boolean", float: "a number",
            list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__) + shown
