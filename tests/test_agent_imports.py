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


def test_a_noops_requests_load_nothing_they_do_not_use(tmp_path):
    data, _ = shipping.artifact()
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(data)
    res = subprocess.run(["python3", "-I", "-S", "-c", NOOP, str(pyz)], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    assert sorted(m for m in NOT_ON_A_NOOP if m in loaded) == []
    assert "specops.agent.converge.upstream" in loaded and "specops.agent.services.listeners" in loaded


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
