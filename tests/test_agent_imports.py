"""What the agent loads on a no-op deploy's two requests (a probe, a verify), which every host pays
for on every run: its modules from the zip, in python3 -I -S as the loader runs them, and only the
standard library they use there.  No fleet."""
import subprocess

from specops.remote import shipping

# A no-op's requests: their handlers' modules (main.HANDLERS: probe, verify), the lock (checked and
# given back), the agent's start (die_with_connection on a pipe, as sshd gives it), a progress line
# (verify says "ready after"), and a probe of a file whose content is sent (state.json's).
NOOP = """
import os, sys
sys.path.insert(0, sys.argv[1])
from specops.agent import main, host, lock
import specops.agent.converge.probe, specops.agent.services.service_http
r, w = os.pipe()
out = open(w, "wb")  # kept open: the watcher polls it
main.die_with_connection(out)
host.say("  sglang: ready after 0.1s")
answer = main.answer('{"kind": "probe", "files": ["%s"], "content": {"%s": "always"}}' % (sys.argv[1], sys.argv[1]))
assert answer["ok"] and answer["result"]["files"][sys.argv[1]]["content_b64"], answer
print(" ".join(sorted(sys.modules)))
"""

# What a no-op does not use, and costs every call's start (each with what it imports in turn):
# spawning (subprocess: threading, selectors, locale), regular expressions (re, and json and base64
# through it), prctl (ctypes), enums (signal's and socket's Python layers), the import machinery's
# Python layer (importlib).
NOT_ON_A_NOOP = ("subprocess", "threading", "selectors", "locale", "re", "json", "base64", "ctypes", "enum",
                 "signal", "socket", "importlib")


def in_the_agent(code, tmp_path):
    """What `code` prints, run by python3 -I -S with the agent's zip (its argv[1]) as its only path."""
    data, _ = shipping.artifact()
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(data)
    res = subprocess.run(["python3", "-I", "-S", "-c", code, str(pyz)], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_a_noops_requests_load_nothing_they_do_not_use(tmp_path):
    loaded = set(in_the_agent(NOOP, tmp_path).split())
    assert sorted(m for m in NOT_ON_A_NOOP if m in loaded) == []
    assert sorted(m for m in loaded if m.startswith("specops.protocol.")) == [
        "specops.protocol.actions", "specops.protocol.converge", "specops.protocol.parts", "specops.protocol.wire"]
    assert "specops.agent.converge.upstream" in loaded and "specops.agent.services.listeners" in loaded
    # a verify of one HTTP service, no router's: its ranks and a router's members are not asked for
    assert "specops.agent.services.ranks" not in loaded and "specops.agent.services.routing" not in loaded


def test_what_the_noop_path_does_without_re_is_what_re_did():
    """A distribution's name normalized (upstream.normalized) and host text cleaned (host.clean's
    shortcut for text with no control character) as the regular expressions they replace give."""
    import random
    import re
    from specops.agent import host
    from specops.agent.converge import upstream
    rng = random.Random(5)
    host.clean("\x1b")  # compiles the expression clean uses for text it cannot pass as it is
    control = host._CONTROL[0]
    for _ in range(3000):
        name = "".join(rng.choice("-_.aZ9İ") for _ in range(rng.randrange(12)))
        assert upstream.normalized(name) == re.sub(r"[-_.]+", "_", name).lower(), name
        text = "".join(rng.choice(["a", " ", "\n", "\t", "\x1b", "[2m", "\x7f", "\x85", "\u2028", "é", "\x00", "0"])
                       for _ in range(rng.randrange(12)))
        assert host.clean(text) == control.sub("", text), repr(text)


# The protocol's other messages, in an agent that has loaded only a no-op's: each kind is known,
# refused or decoded as before, and an unknown kind's refusal names every kind.
LATER = """
import sys
sys.path.insert(0, sys.argv[1])
from specops import protocol
from specops.agent import main
assert "specops.protocol.lifecycle" not in sys.modules
print(protocol.changes_host("stop"), protocol.changes_host("releases"), protocol.changes_host("nope"))
print(main.answer('{"kind": "nope"}')["error"])
print(main.answer('{"kind": "stop", "services": []}')["error"])
print(protocol.decode_request({"kind": "renew", "token": "t"}) == protocol.Renew(token="t"), protocol.ROLLED_BACK)
"""


def test_a_message_a_noop_does_not_load_is_known_as_every_other(tmp_path):
    from specops import protocol
    assert in_the_agent(LATER, tmp_path).splitlines() == [
        "True False False",
        "request: unknown request kind 'nope' (known: %s)" % ", ".join(protocol.REQUEST_KINDS),
        "stop changes the host: it runs only for a run that holds the host lock",
        "True rolled-back"]
