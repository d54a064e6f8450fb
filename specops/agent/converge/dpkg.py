"""Whether Debian packages are installed, read from dpkg's own status file, and for one that is not,
whether the host's package lists have a candidate for it (apt-cache policy, which reads only the
lists on disk: it fetches nothing).  A no-op's probe spawns nothing here (but while dpkg's
journal of changes is not empty): it spared the monitoring
role's shell, dpkg-query and grep (~8 ms of a host's CPU a package, on a bench host)."""
import os

from specops.agent.lean import status_output
from specops.protocol import CANDIDATE, INSTALLED, NO_CANDIDATE

STATUS = "/var/lib/dpkg/status"
UPDATES = "/var/lib/dpkg/updates"  # dpkg's journal of changes not folded into STATUS yet


def states(names):
    """name -> INSTALLED, CANDIDATE or NO_CANDIDATE.  While dpkg's journal holds changes (dpkg is
    running, or was cut off), dpkg-query, which reads the journal too, is asked instead."""
    try:
        pending = any(n.isdigit() for n in os.listdir(UPDATES))
    except OSError:
        pending = False
    try:
        with open(STATUS, "rb") as f:
            data = b"\n" + f.read()
    except OSError:
        data = b""
    seen = _queried if pending else (lambda name: installed(data, name))
    return {n: INSTALLED if seen(n) else _candidate(n) for n in names}


def _queried(name):
    try:
        status, out, _ = status_output(["dpkg-query", "-W", "-f=${Status}", name])
    except OSError:  # no dpkg on this host
        return False
    return status == 0 and out.split()[-1:] == ["installed"]


def installed(data, name):
    """Whether a stanza of dpkg's status file (`data`, after a newline) for package `name` says it
    is installed: its Status's last word (`hold ok installed` is installed too).  A multi-arch
    package has a stanza per architecture: any one will do."""
    head = b"\nPackage: " + name.encode() + b"\n"
    at = data.find(head)
    while at >= 0:
        end = data.find(b"\n\n", at + 1)
        stanza = data[at:end if end >= 0 else len(data)]
        for line in stanza.split(b"\n"):
            if line.startswith(b"Status: ") and line.split()[-1] == b"installed":
                return True
        at = data.find(head, at + 1)
    return False


def _candidate(name):
    import subprocess  # only for a package not installed
    try:
        out = subprocess.run(["apt-cache", "policy", name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True).stdout
    except OSError:  # no apt on this host
        return NO_CANDIDATE
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            return NO_CANDIDATE if line.split(":", 1)[1].strip() in ("", "(none)") else CANDIDATE
    return NO_CANDIDATE
