"""The prompts spec-bench (and spec-tune, through it) sends, on the controller: reading the user's
prompt file, refusing a malformed one in one line that names where, sampling a load's share of it
reproducibly, and naming the set a result was measured with.

A file is either
  - a JSON list of strings (files/prompts.json, the default); or
  - JSONL: one object a line, {"prompt": "..."} (sent to /generate) or OpenAI-style
    {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]} (sent to
    the service's chat endpoint, so the server's own chat template applies); blank lines skipped,
    other keys ignored.
A result names its prompt set by the path as given, the sha256 of the file's bytes, and how many
prompts the file holds and how many were sent (a load that uses fewer samples them).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from . import usertext
from .errors import UsageError
from .protocol.bench import sampled

DEFAULT = Path(__file__).resolve().parents[1] / "files" / "prompts.json"
DEFAULT_NAME = "files/prompts.json"
ROLES = ("system", "user", "assistant", "tool")
NEEDS = 'needs "prompt" (a string) or "messages" (a list of {role, content})'
# A prompt file is held whole in memory, its bytes and its prompts both: the most it may hold is
# far above any set a bench sends (files/prompts.json is a few KiB; thousands of long chats, tens
# of MiB), and far below what would exhaust the controller when a wrong path (a disk image, a
# log) is given.
LIMIT = 256 << 20


@dataclass(frozen=True)
class PromptSet:
    """The prompts of one file, in file order: each a string or {"messages": [{role, content}]}."""
    name: str
    sha256: str
    prompts: list

    def sample(self, limit: int | None = None, seed: int = 0) -> list:
        """`limit` of the prompts, picked by `seed` and kept in file order; all of them when the
        file holds no more than that."""
        return sampled(self.prompts, limit, seed)

    def identity(self, sent: int) -> dict:
        """What a result records of the set: its name, digest, size, and how many were sent."""
        return {"prompts": self.name, "prompts_sha256": self.sha256, "prompts_count": len(self.prompts),
                "prompts_sent": sent}


def read(path: str | None = None) -> PromptSet:
    """The prompt set in `path` (None: files/prompts.json); UsageError names what is wrong and where."""
    where = Path(path).expanduser() if path else DEFAULT
    try:
        # O_NONBLOCK: a FIFO's open would wait for a writer; opened, its fstat refuses it.
        with os.fdopen(os.open(where, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            data = _whole(f, where)
    except OSError as e:
        raise UsageError(f"prompts {where}: {e.strerror or e}") from None
    return PromptSet(path or DEFAULT_NAME, hashlib.sha256(data).hexdigest(), parse(data, str(where)))


def _whole(f, where: Path) -> bytes:
    """The bytes of the opened file `f`: only a regular file (a FIFO, a device could wait for ever
    or never end), of LIMIT bytes at most, however much it grows while read."""
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"prompts {where}: not a regular file")
    data = f.read(LIMIT + 1)
    if max(st.st_size, len(data)) > LIMIT:
        raise UsageError(f"prompts {where}: {max(st.st_size, len(data))} bytes, more than a prompt file may hold "
                         f"({LIMIT}): is it the prompt file?")
    return data


def parse(data: bytes, where: str) -> list:
    """The prompts in a file's bytes, in order (the formats in the module's docstring)."""
    text = usertext.decoded(data, f"prompts {where}", bom=True)
    if not text.strip():
        raise UsageError(f"prompts {where}: empty (no prompts)")
    prompts = _json_list(text, where) if text.lstrip().startswith("[") else _jsonl(text, where)
    if not prompts:
        raise UsageError(f"prompts {where}: empty (no prompts)")
    return prompts


def _json_list(text: str, where: str) -> list:
    try:
        prompts = json.loads(text)
    except ValueError as e:
        raise UsageError(f"prompts {where} line {e.lineno}: not JSON ({e.msg} at column {e.colno})") from None
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise UsageError(f"prompts {where}: item {i} of the JSON list is {_kind(p)}, not a string "
                             "(a JSON list holds strings; messages go in a JSONL file)")
    return prompts


def _jsonl(text: str, where: str) -> list:
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise UsageError(f"prompts {where} line {n}: not JSON ({e.msg} at column {e.colno})") from None
        problem = _problem(item)
        if problem:
            raise UsageError(f"prompts {where} line {n}: {problem}")
        prompts.append(item["prompt"] if "prompt" in item else
                       {"messages": [{"role": m["role"], "content": m["content"]} for m in item["messages"]]})
    return prompts


def _problem(item) -> str | None:
    """What is wrong with one JSONL line's value, else None."""
    if not isinstance(item, dict):
        return f"{NEEDS}, in a JSON object, not {_kind(item)}"
    if "prompt" in item and "messages" in item:
        return 'has both "prompt" and "messages": give one'
    if "prompt" in item:
        return None if isinstance(item["prompt"], str) else f'"prompt" is {_kind(item["prompt"])}, not a string'
    messages = item.get("messages")
    if not isinstance(messages, list):
        return NEEDS if messages is None else f"{NEEDS}; \"messages\" is {_kind(messages)}"
    if not messages:
        return '"messages" is empty: it needs at least one {role, content}'
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{i}] is {_kind(m)}, not an object with role and content"
        if m.get("role") not in ROLES:
            return f"messages[{i}]: role {json.dumps(m.get('role'))} is not one of {', '.join(ROLES)}"
        if not isinstance(m.get("content"), str):
            return f"messages[{i}]: content is {_kind(m.get('content'))}, not a string"
    return None


def _kind(value) -> str:
    """A JSON value's kind, as a person reads it in an error."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)
