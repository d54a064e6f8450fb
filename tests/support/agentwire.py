"""The agent's wire as a test sees it: the answers' frames, and the real loader run under a
cache directory of the test's own (AGENT_HOME moved there)."""
import json
import subprocess

from specops import layout
from specops.remote import shipping

REQUEST = b'{"kind": "unlock", "token": "x"}'  # a request any agent answers, changing nothing
ANSWER = [{"ok": True, "result": {"released": False, "running": []}}]


def frames(data: bytes) -> list:
    out = []
    while data:
        head, _, data = data.partition(b"\n")
        out.append(json.loads(data[:int(head)]))
        data = data[int(head):]
    return out


def run_loader(home, stdin: bytes, loader: str = shipping.LOADER) -> subprocess.CompletedProcess:
    """The loader as a host runs it (python3 -I -S -c), keeping its bytecode in `home`."""
    loader = loader.replace(repr(layout.AGENT_HOME), repr(str(home)))
    return subprocess.run(["python3", "-I", "-S", "-c", loader], input=stdin, capture_output=True)


def header(stdin: bytes) -> tuple[list[bytes], bytes]:
    """The preamble's header fields (sha, size, magic, made size, made sha) and what follows."""
    head, rest = stdin.split(b"\n", 1)
    return head.split(), rest
