"""Ansible inventories as they are: its INI format, and its connection variables.

A team that manages its GPU boxes with Ansible already has an inventory.  `parse_ini` reads
Ansible's INI format into the same all → children → hosts tree a hosts.yml has; `translate`
maps the `ansible_*` connection variables to ours (one spelling per host, or a one-line
error) and sets the unknown `ansible_*` keys aside, to be named in one warning line each; one
a single typo away from a key it reads (`ansible_usr`) is refused, since ignoring it would log in
as someone else.

Values are typed as Ansible's own INI plugin types them (lib/ansible/plugins/inventory/ini.py,
`_parse_value`): a Python literal where the text is one (`5` is 5, `True` is True, `'5'` is "5"),
else the text.  That holds for a host line's key=value words and for a `[group:vars]` line alike
(the plugin's documentation says :vars values stay strings; its code literal-evaluates them too).
"""
from __future__ import annotations

import ast
import re
import shlex
import warnings as py_warnings
from pathlib import Path
from typing import Any

from .. import usertext
from ..errors import UsageError
from ..remote import become
from .checker import did_you_mean, key_path

ALIASES = {
    "ansible_host": "address",
    "ansible_user": "ssh_user",
    "ansible_port": "ssh_port",
    "ansible_ssh_private_key_file": "ssh_key",
    "ansible_become": "become",
    "ansible_become_method": "become_method",
    # the older spellings Ansible's ssh connection still reads (plugins/connection/ssh.py): ignored,
    # they would send the run to the local user's login on another address
    "ansible_ssh_host": "address",
    "ansible_ssh_user": "ssh_user",
    "ansible_ssh_port": "ssh_port",
    "ansible_private_key_file": "ssh_key",
}
BOOLEAN = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
# A comment may follow a section, as Ansible's INI plugin reads it (`[gpu]  # the A100s`).
_SECTION = re.compile(r"^\[([^\[\]:]+)(?::(vars|children))?\]\s*(?:#.*)?$")  # no bracket in a name
_HOST = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+$")  # a name, an address, a range (web[01:09])


# Ansible's sudo become plugin reads its password from any of these (become/sudo.py, become_pass).
PASSWORDS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass")


def _typed(value: Any) -> Any:
    """What Ansible keeps of a literal: tuples and sets as lists, nested alike; `...` and complex
    numbers as their text; bytes as text (a mapping's keys as they are, as Ansible leaves them)."""
    if isinstance(value, (list, tuple, set)):
        return [_typed(v) for v in value]
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if value is ... or isinstance(value, complex):
        return "..." if value is ... else str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


def _value(text: str, where: str) -> Any:
    """An INI value as Ansible types it: a Python literal, else the text itself."""
    try:
        with py_warnings.catch_warnings():  # as Ansible: "\d" in a value is no warning
            py_warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    except (RecursionError, MemoryError):  # Ansible fails the whole inventory on these
        raise UsageError(f"{where}: the value is nested too deeply to read") from None
    return _typed(value)


def _pairs(words: list[str], where: str) -> dict:
    out = {}
    for n, word in enumerate(words, 1):
        key, sep, value = word.partition("=")
        if not sep or not key:  # (the word itself is not shown: it may be half of a quoted secret)
            raise UsageError(f"{where}: word {n} is not key=value (quote values with spaces)")
        out[key] = _value(value, where)
    return out


def looks_like_ini(path: Path) -> bool:
    """Whether a file reads as an Ansible INI inventory (so `-i DIR` can take one named `hosts`
    or `production`, and not a README or a Makefile): every line that is not blank or a comment
    is a [section], a host name followed by key=value words only, or key=value words (a group's
    vars), and one at least is."""
    try:
        with path.open(encoding="utf-8") as f:
            text = f.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return False
    seen = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        try:
            words = [] if _SECTION.match(line) else shlex.split(line, comments=True)
        except ValueError:
            return False
        if words and not all("=" in w for w in words[1 if _HOST.match(words[0]) else 0:]):
            return False  # neither a host line nor a [group:vars] line
        seen = True
    return seen


def _not_a_section(line: str, first: str, where: str) -> None:
    """Refuses a line that is neither a section nor a name: a section with a bracket missing (a
    `[gpu` read as a host would put the hosts below it in the group above), or a host range."""
    if line.startswith("["):
        if "]" not in line:
            raise UsageError(f"{where}: {line!r} is missing its closing bracket: a group is written {line}]")
        meant = line.split("#")[0].strip().strip("[]")  # `[[gpu]`, `[gpu]]`: the section within
        if _SECTION.match(f"[{meant}]"):
            raise UsageError(f"{where}: {line!r} has a bracket too many: a group is written [{meant}]")
        raise UsageError(f"{where}: {line!r} is not a section: write [group], [group:vars] or [group:children]")
    if first.endswith("]") and "[" not in first:
        raise UsageError(f"{where}: {first!r} is missing its opening bracket: a group is written [{first}")
    if "]" in first and "[" not in first:  # `]gpu`: no host name has one
        raise UsageError(f"{where}: {first!r} has a closing bracket without its opening one: a group is written "
                         "[group]")
    if "[" in first:
        raise UsageError(f"{where}: host ranges such as {first!r} are not supported; list the hosts")


def parse_ini(path: Path) -> dict:
    """Ansible's INI inventory as {"all": {...}}: [group], [group:vars], [group:children];
    hosts before the first section are in "ungrouped"."""
    lines = usertext.read(path).splitlines()
    groups: dict[str, dict] = {"ungrouped": {}}
    section, kind = "ungrouped", None
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        where = f"{path}:{number}"
        m = _SECTION.match(line)
        if m:
            section, kind = m.group(1), m.group(2)
            groups.setdefault(section, {})
            continue
        node = groups[section]
        if kind == "vars":  # one key=value a line, all after the first = the value (as Ansible reads it)
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"{where}: a [{section}:vars] line is key=value")
            node.setdefault("vars", {})[key.strip()] = _value(value.strip(), where)
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from None
        _not_a_section(line, words[0], where)
        if kind == "children":
            node.setdefault("children", {})[words[0]] = None
        else:
            node.setdefault("hosts", {})[words[0]] = _pairs(words[1:], where) or None
    children_of = {g for node in groups.values() for g in (node.get("children") or {})}
    top = {name: node for name, node in groups.items() if name not in children_of and name != "all" and node}
    for node in groups.values():
        for child in list(node.get("children") or {}):
            node["children"][child] = groups.setdefault(child, {})
    root = dict(groups.get("all") or {})
    root["children"] = {**(root.get("children") or {}), **top}
    return {"all": root}


def _one_edit(typed: str, known: str) -> bool:
    """One letter added, dropped or changed, or two neighbours swapped, turns `typed` into `known`."""
    if typed == known or abs(len(typed) - len(known)) > 1:
        return False
    i = next((n for n, (a, b) in enumerate(zip(typed, known)) if a != b), min(len(typed), len(known)))
    if len(typed) != len(known):
        longer, shorter = (typed, known) if len(typed) > len(known) else (known, typed)
        return longer[i + 1:] == shorter[i:]
    return typed[i + 1:] == known[i + 1:] or (typed[i:i + 2] == known[i:i + 2][::-1] and typed[i + 2:] == known[i + 2:])


def translate(values: dict, file: str, where: str, warnings: list[str]) -> dict:
    """`values` (at key path `where` of `file`) with ansible_* connection variables under our
    names; unknown ansible_* keys are dropped with a warning, or refused one typo away from one we
    read; a setting written both ways is an error."""
    at = f"{file}: {where}" if where else file
    out = {k: v for k, v in values.items() if not k.startswith("ansible_")}
    for key, value in values.items():
        if not key.startswith("ansible_"):
            continue
        if key in PASSWORDS:  # (its value is never repeated: it is a secret)
            warnings.append(f"warning: {at}: {key} is ignored: specops reads no password from the inventory; "
                            f"use --ask-become-pass or set {become.ENV}")
            continue
        ours = ALIASES.get(key)
        if ours is None:
            near = [k for k in ALIASES if _one_edit(key, k)]
            if near:
                raise UsageError(f"{file}: {key_path(where, key)}: unknown key{did_you_mean(key, near, 'ansible_')}")
            warnings.append(f"warning: {at}: {key} is not used by specops; ignored"
                            f"{did_you_mean(key, ALIASES, 'ansible_')}")
            continue
        same = [k for k in values if k != key and (k == ours or ALIASES.get(k) == ours)]
        if same:
            raise UsageError(f"{at}: both {key} and {same[0]} are set; keep one spelling")
        if ours == "become" and not isinstance(value, bool):
            # Ansible's boolean(): yes/no, true/false, on/off and 1/0, as text or (INI-typed) numbers
            word = str(value).lower() if isinstance(value, (str, int)) else None
            if word not in BOOLEAN:
                raise UsageError(f"{file}: {key_path(where, key)}: must be true or false, not {value!r}")
            value = BOOLEAN[word]
        if ours == "ssh_port" and isinstance(value, str) and value.isdigit():
            value = int(value)
        out[ours] = value
    return out
