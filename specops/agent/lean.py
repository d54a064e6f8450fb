"""The standard library as a no-op's requests use it, from its C modules alone.

The agent starts on every run of every host, and a no-op's probe and verify use little of json,
signal, socket and subprocess: their Python layers import re, enum, selectors, threading and
locale for what the agent never uses.  Each put back alone cost a no-op's imports (python3 -I -S,
measured on one loaded machine): json ~5 ms of CPU, signal's and socket's ~5, subprocess ~8.  So here:

- json: `loads`, `load` and `dumps` (its defaults, and sort_keys) by json's own C accelerator,
  giving what json gives: the same text, the same value; for what it would refuse, json itself
  says so (imported then, to raise its own error);
- signal: the C module (`_signal`): the same functions and numbers, without the enums;
- socket: the C module, and `connect`, socket.create_connection's loop over the addresses;
- subprocess: `output`, a short command's output as subprocess.run gives it, by os.posix_spawn
  (subprocess imports threading, selectors, locale and signal's enums).

Each falls back to the module itself on an interpreter without the C one.
"""
import os

try:
    import _json
except ImportError:  # an interpreter without json's accelerator: json itself does everything
    _json = None
try:
    import _signal as signal
except ImportError:
    import signal  # noqa: F401
try:
    import _socket as socket
except ImportError:
    import socket

WHITESPACE = " \t\n\r"  # json's (json.decoder.WHITESPACE)
# Bytes json.detect_encoding reads as anything but UTF-8 start with a BOM or hold a NUL in their first four.
BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")


def _json_module():
    import json  # only where json's own rules and words are needed: what json refuses
    return json


class _Decoder:
    """What json's C scanner reads of a decoder: json.JSONDecoder()'s defaults."""
    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan = _json.make_scanner(_Decoder()) if _json else None


def loads(s):
    """json.loads(s): the same value, or json's own error."""
    if isinstance(s, (bytes, bytearray)) and not s[:4].count(0) and not s.startswith(BOMS):
        s = s.decode("utf-8", "surrogatepass")  # as json.loads decodes them
    if _scan is None or not isinstance(s, str) or s.startswith("\ufeff"):
        return _json_module().loads(s)
    try:
        value, end = _scan(s, len(s) - len(s.lstrip(WHITESPACE)))
    except StopIteration:  # no value where one starts: json says where
        return _json_module().loads(s)
    if s[end:].strip(WHITESPACE):  # more after the value: json says where
        return _json_module().loads(s)
    return value


def load(f):
    """json.load(f)."""
    return loads(f.read())


def _default(value):
    raise TypeError  # dumps lets json say what it cannot encode


def dumps(value, sort_keys=False):
    """json.dumps(value, sort_keys=sort_keys): the same text (ASCII, ", " and ": "), or json's own error."""
    if _json is None:
        return _json_module().dumps(value, sort_keys=sort_keys)
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    encode = _json.make_encoder({}, _default, _json.encode_basestring_ascii, None, ": ", ", ", sort_keys, False,
                                True)
    try:
        return "".join(encode(value, 0))
    except TypeError:  # a value json cannot encode: its own error says which
        return _json_module().dumps(value, sort_keys=sort_keys)


def connect(host, port, timeout):
    """socket.create_connection((host, port), timeout): a connected socket to the first of the
    host's addresses that accepts, else the last address's error."""
    error = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = None
        try:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as e:
            error = e
            if sock is not None:
                sock.close()
    raise error if error is not None else OSError("getaddrinfo returns an empty list")


def output(argv):
    """subprocess.run(argv, stdout=PIPE, universal_newlines=True).stdout: the text of a short
    command (stdin the agent's, as there; what it says on stderr, which no caller reads, to /dev/null)."""
    return _spawned(argv, False)[1]


def status_output(argv):
    """(exit status, stdout, stderr) of a short command that says little on stderr (read once its
    stdout ends), without subprocess: ~8 ms of the agent's CPU to import."""
    return _spawned(argv, True)


def _spawned(argv, stderr):
    pipes = [os.pipe() for _ in range(2 if stderr else 1)]
    actions = [(os.POSIX_SPAWN_DUP2, w, fd) for fd, (_, w) in enumerate(pipes, 1)]
    if not stderr:
        actions.append((os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0))
    try:
        # SIGPIPE and SIGXFSZ at their defaults, as subprocess restores them: Python ignores both
        pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=actions,
                              setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except BaseException:
        for r, _ in pipes:
            os.close(r)
        raise
    finally:
        for _, w in pipes:
            os.close(w)
    texts = []
    try:
        for r, _ in pipes:
            with open(r) as f:  # decoded as subprocess does: the locale's encoding, universal newlines
                texts.append(f.read())
    finally:
        status = os.waitpid(pid, 0)[1]
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    return (code, texts[0], texts[1] if stderr else "")
