"""Quoting for systemd unit files and environment files.

systemd's ExecStart is not a shell: it accepts a quote only around a whole
word, expands $VAR and ${VAR}, and treats % as a specifier.  shlex.quote's
'a'"'"'b' form is therefore wrong here; each word is double-quoted with
backslash, quote, dollar and percent escaped.
"""
from __future__ import annotations

import re

from ..errors import UsageError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _plain(value: str, what: str) -> str:
    if any(ch in value for ch in "\n\r\0"):
        raise UsageError(f"{what}: newlines and NUL bytes are not allowed in {value[:30]!r}")
    return value


def quote_word(word: str, what: str = "argument") -> str:
    _plain(word, what)
    escaped = (word.replace("\\", "\\\\").replace('"', '\\"')
               .replace("$", "$$").replace("%", "%%"))
    return f'"{escaped}"'


def exec_line(argv: list[str], expand: dict[int, str] | None = None) -> str:
    """argv as an ExecStart value; `expand` maps positions to ${VAR} taken from the environment."""
    words = []
    for i, a in enumerate(argv):
        words.append(f"${{{expand[i]}}}" if expand and i in expand else quote_word(a))
    return " ".join(words)


def _env_key(key: str, what: str) -> str:
    if not _ENV_NAME.match(key):
        raise UsageError(f"{what}.{key}: not a valid environment variable name")
    return key


def unit_environment(key: str, value: str, what: str = "env") -> str:
    """A quoted Environment= value: systemd resolves % specifiers there, but not $."""
    _plain(value, f"{what}.{key}")
    text = f"{_env_key(key, what)}={value}".replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{text}"'


def envfile_line(key: str, value: str, what: str = "env_secret") -> str:
    """KEY="value" for an EnvironmentFile, where \\ " ` $ are escaped inside double quotes."""
    _plain(value, f"{what}.{key}")
    escaped = "".join("\\" + ch if ch in '"\\`$' else ch for ch in value)
    return f'{_env_key(key, what)}="{escaped}"'
