"""The agent's standard library from C modules (agent/lean.py) gives what the modules themselves
give: json's text and values and errors, socket.create_connection's socket, subprocess.run's
output.  Property-style: the protocol's messages and fuzzed values and texts.  No fleet."""
import json
import random
import socket
import subprocess

import pytest

from specops import protocol
from specops.agent import lean

from test_protocol import SAMPLES

SEEDS = range(300)


def _outcome(call, *args, **kwargs):
    """What a call gives: ("=", its value as json's text, so NaN equals NaN) or (its error's type and words)."""
    try:
        value = call(*args, **kwargs)
    except Exception as e:
        return type(e).__name__, str(e)
    return "=", value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _value(rng, depth=0):
    """A random value as the agent's answers hold them, and what json cannot encode."""
    kind = rng.randrange(12 if depth < 4 else 8)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 2 ** 64, -(2 ** 70), rng.randrange(-10 ** 9, 10 ** 9)])
    if kind == 2:
        return rng.choice([0.0, -0.0, 1e308, 5e-324, float("inf"), float("-inf"), float("nan"), rng.random() * 1e6])
    if kind in (3, 4, 5, 6):
        return "".join(rng.choice(["a", "é", "\n", "\t", '"', "\\", "\x00", "\x1b", "\x7f", "\u2028", "\ud800",
                                   "\U0001f600", "/", " "]) for _ in range(rng.randrange(8)))
    if kind == 7:
        return rng.choice([b"x", {1, 2}, object(), 1j]) if rng.random() < 0.05 else "plain"
    if kind in (8, 9):
        return [_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    keys = [_value(rng, 4) if rng.random() < 0.1 else "k%d" % rng.randrange(9) for _ in range(rng.randrange(5))]
    return {k: _value(rng, depth + 1) for k in keys if k is None or isinstance(k, (str, int, float, bool))}


@pytest.mark.parametrize("sort_keys", [False, True])
def test_dumps_writes_what_json_writes(sort_keys):
    probed = protocol.ProbeResult(time=1.5, hostname="h", python="/usr/bin/python3", files={"/x": {"exists": False}})
    messages = [protocol.encode(m, unlock="tok") for m in SAMPLES] + [protocol.encode(probed)]
    answers = [{"ok": True, "result": m} for m in messages] + [{"ok": False, "error": "x \u00e9 \x1b"}, "text", 1.0]
    for value in messages + answers + [_value(random.Random(seed)) for seed in SEEDS]:
        assert _outcome(lean.dumps, value, sort_keys=sort_keys) == _outcome(json.dumps, value, sort_keys=sort_keys)
    loop = []
    loop.append(loop)
    assert _outcome(lean.dumps, loop) == _outcome(json.dumps, loop) == ("ValueError", "Circular reference detected")


def _texts():
    """JSON texts and near misses: every message and fuzzed value written, then cut, grown, changed."""
    rng = random.Random(7)
    texts = [json.dumps(protocol.encode(m)) for m in SAMPLES]
    values = [_value(random.Random(seed)) for seed in SEEDS]
    texts += [json.dumps(v) for v in values if _outcome(json.dumps, v)[0] == "="]
    texts += ["", " ", "\ufeff{}", " {} ", "{}\n", "{} {}", "[1,]", "NaN", "-Infinity", "[Infinity]", "01", "1e5",
              '"\\ud800"', '"a\nb"', '{"a": 1, "a": 2}', "[" * 100000 + "]" * 100000, "\t\r\n[1] \t"]
    out = list(texts)
    for text in texts[:200]:
        for _ in range(3):
            at = rng.randrange(len(text) + 1)
            out.append(text[:at] + rng.choice(["", "x", ",", "]", "}", '"', " ", "\x00", "\\", "1"]) + text[at + 1:])
    return out


def test_loads_reads_what_json_reads_and_refuses_what_it_refuses():
    for text in _texts():
        assert _outcome(lean.loads, text) == _outcome(json.loads, text), text[:200]
        for data in (text.encode("utf-8", "surrogatepass"), bytearray(text.encode("utf-8", "surrogatepass"))):
            assert _outcome(lean.loads, data) == _outcome(json.loads, data), text[:200]
    for data in (b"\xef\xbb\xbf[1]", "[1]".encode("utf-16"), "[1]".encode("utf-32-le"), b"1\x00", b"\xff", b"",
                 b"\x00\x001", 1, None):
        assert _outcome(lean.loads, data) == _outcome(json.loads, data), data


def test_connect_connects_as_create_connection_does():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        sock = lean.connect(b"localhost", port, 5)
        try:
            assert sock.gettimeout() == 5 and sock.getpeername() == ("127.0.0.1", port)
        finally:
            sock.close()
    with pytest.raises(ConnectionRefusedError):  # closed now: its port refuses, as create_connection says
        lean.connect(b"127.0.0.1", port, 5)


@pytest.mark.parametrize("argv", [
    ["printf", "a=1\\r\\nb=\\303\\251\\rc\\n"],  # universal newlines, the locale's (UTF-8) decoding
    ["sh", "-c", "echo out; echo err >&2; exit 3"],
])
def test_output_gives_what_subprocess_run_gives(argv):
    assert lean.output(argv) == subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                               universal_newlines=True).stdout
    with pytest.raises(FileNotFoundError):
        lean.output(["/nonexistent/specops-test"])
    res = subprocess.run(argv, capture_output=True, universal_newlines=True)
    assert lean.status_output(argv) == (res.returncode, res.stdout, res.stderr)
    killed = ["sh", "-c", "kill -9 $$"]
    assert lean.status_output(killed)[0] == subprocess.run(killed).returncode == -9


def test_a_command_output_runs_starts_with_the_signals_subprocess_gives_it():
    """SIGPIPE and SIGXFSZ at their defaults (Python ignores both, and exec keeps what is ignored),
    nothing blocked.  glibc's posix_spawn leaves its own two internal signals (32, 33) ignored,
    which glibc sets up again in every program it starts (systemctl among them): not compared."""
    def ignored_and_blocked(run):
        lines = run(["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]).splitlines()
        status = dict(line.split(":\t") for line in lines)
        return int(status["SigIgn"], 16) & ~(0b11 << 31), int(status["SigBlk"], 16)
    ours = ignored_and_blocked(lean.output)
    assert ours == ignored_and_blocked(lambda argv: subprocess.run(argv, stdout=subprocess.PIPE,
                                                                   universal_newlines=True).stdout)
    assert not ours[0] & (1 << 12 | 1 << 24)  # SIGPIPE (13) and SIGXFSZ (25) not ignored
