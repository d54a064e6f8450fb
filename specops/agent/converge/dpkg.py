"""Whether Debian packages are installed, read from dpkg's own status file, and for one that is not,
whether the host's package lists have a candidate for it (apt-cache policy, which reads only the
lists on disk: it fetches nothing).  A no-op's probe spawns nothing here: it spared the monitoring
role's shell, dpkg-query and grep (~8 ms of a host's CPU a package, on a bench host)."""
from specops.protocol import CANDIDATE, INSTALLED, NO_CANDIDATE

STATUS = "/var/lib/dpkg/status"


def states(names):
    """name -> INSTALLED, CANDIDATE or NO_CANDIDATE."""
    try:
        with open(STATUS, "rb") as f:
            data = b"\n" + f.read()
    except OSError:
        data = b""
    return {n: INSTALLED if installed(data, n) else _candidate(n) for n in names}


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
