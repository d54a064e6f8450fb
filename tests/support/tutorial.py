"""docs/tutorial.md as the suite runs it: each command line of its ```bash blocks, in order, through
bash, with what its comment promises checked (`exits N`: that exit code, else 0; `says "..."`:
those words in its output).  Lines that set a shell variable (I="...") are kept and given to every
later line, as one shell session would.  The only thing changed in a line is where the sandbox's
inventory lives: a test's sandbox site keeps it in its own state directory, not sandbox/inventory.
Pure parsing here; tests/test_sandbox_fleet.py runs it on a sandbox host, with resolve_docstring
(below) as the person who resolves the demo patch's conflict."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
SETUP = "bash scripts/setup.sh"  # the suite's own setup ran it: a step the runner does not repeat
SAYS = re.compile(r'says "([^"]*)"')
EXITS = re.compile(r"\bexits (\d+)\b")


@dataclass
class Step:
    command: str
    exits: int = 0
    says: list = field(default_factory=list)

    @property
    def sets(self) -> bool:
        return re.match(r"^[A-Za-z_]\w*=", self.command) is not None


def steps(text: str | None = None) -> list[Step]:
    """The tutorial's command lines, with what each comment promises."""
    text = TUTORIAL.read_text() if text is None else text
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command, _, comment = line.partition("  #")
            command = command.strip()
            if not command or command.startswith("#"):
                continue
            exits = EXITS.search(comment)
            out.append(Step(command, int(exits.group(1)) if exits else 0, SAYS.findall(comment)))
    return out


def run(step: Step, before: list[Step], inventory: Path, env: dict,
        timeout: float = 900) -> subprocess.CompletedProcess:
    """One step through bash from the clone's directory, after the variables set before it."""
    script = "\n".join([s.command for s in before if s.sets] + [step.command])
    script = script.replace("sandbox/inventory", str(inventory))
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env}, stdin=subprocess.DEVNULL)


def broken_promises(step: Step, res: subprocess.CompletedProcess) -> list[str]:
    """What the step's comment promised and its run did not do (empty: all held)."""
    out = res.stdout + res.stderr
    wrong = [f"exit {res.returncode}, not {step.exits}"] if res.returncode != step.exits else []
    return wrong + [f"no {w!r} in its output" for w in step.says if w not in out]


def resolve_docstring(merged: str) -> str:
    """What a person makes of the demo patch's conflict: 0.5.24's docstring, with the patch's line."""
    m = re.search(r'<<<<<<< [^\n]*\n(.*?)\|\|\|\|\|\|\| [^\n]*\n.*?=======\n(.*?)>>>>>>> [^\n]*\n', merged, re.S)
    ours, theirs = m.groups()
    note = ours.strip().splitlines()[-1]  # 'Patched: EAGLE-3 layer id -1 captures the embedding output."""'
    resolved = theirs.rstrip().removesuffix('"""') + "\n\n" + note + "\n"
    return merged[:m.start()] + resolved + merged[m.end():]
