"""Who deployed a release and from what (protocol.Provenance): the controller's user and host name,
the git commit of the specops checkout and of the inventory, each "+dirty" when its work tree has
changes.  Read once per run, on the controller (never on a host), by the tasks that record releases.

git is asked with a short timeout; a directory that is not in a git repository, an inventory its
repository does not track (the default inventory/ is git-ignored inside the checkout), git missing,
slow or failing: that commit is left out.  Nothing here ever fails a deploy."""
from __future__ import annotations

import getpass
import os
import socket
import subprocess
from pathlib import Path

from . import protocol

CHECKOUT = Path(__file__).resolve().parent.parent
GIT_TIMEOUT = 3.0  # seconds for each git command
# specops runs as root: git runs no program a repository's config names (fsmonitor, hooks), and
# trusts only repositories of the user it runs as (git's own rule; an empty safe.directory drops a
# system or global `safe.directory=*`), so another user's checkout gives no commit, never their code
SAFE = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=")


def _git(directory: Path, *args: str) -> str | None:
    """git's output in `directory`, or None: not a repository, git missing, slow or failing.  Its
    environment's GIT_* are left out (a hook's GIT_DIR would name another repository), and it takes
    no optional lock (a `git status` beside the user's own git never makes theirs fail)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        res = subprocess.run(["git", *SAFE, "-C", str(directory), *args], capture_output=True, text=True,
                             timeout=GIT_TIMEOUT, env={**env, "GIT_OPTIONAL_LOCKS": "0"}, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return res.stdout if res.returncode == 0 else None


def commit(directory: Path, path: str | None = None) -> str | None:
    """HEAD of the repository `directory` is in, "+dirty" when its work tree has changes (untracked
    files too); None when git cannot say.  `path` (relative to `directory`): only it counts, and only
    when its repository tracks it."""
    if path is not None and not (_git(directory, "ls-files", "--", path) or "").strip():
        return None
    head = (_git(directory, "rev-parse", "HEAD") or "").strip()
    status = _git(directory, "status", "--porcelain", *(("--", path) if path is not None else ())) if head else None
    if status is None:
        return None
    return head + ("+dirty" if status.strip() else "")


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no login name in the environment nor the password database
        return str(os.getuid())


def read(inventory: str | None) -> protocol.Provenance:
    """This run's provenance; `inventory`: the inventory's directory or hosts file (None: not known)."""
    inv = commit(*_split(Path(inventory))) if inventory else None
    return protocol.Provenance(user=_user(), controller=socket.gethostname(), checkout=commit(CHECKOUT), inventory=inv)


def _split(path: Path) -> tuple[Path, str]:
    """(the directory git runs in, the inventory's path from there)."""
    return (path, ".") if path.is_dir() else (path.parent, path.name)
