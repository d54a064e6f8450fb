"""Each service's last verify, as the textfile says it (specops_verified): passed or not, and when.
Kept apart from the textfile's module: every verify writes it, monitored or not, and must not pay
for importing more."""
import os
import time

from specops.agent.lean import dumps, load
from specops.layout import VERDICTS


def verdicts():
    try:
        with open(VERDICTS) as f:
            got = load(f)
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def record(reports):
    """After a verify: each service's verdict, for the textfile (last writer wins, whole file)."""
    now = verdicts()
    now.update({r.name: {"ok": not r.failures, "at": time.time()} for r in reports if not r.starting})
    tmp = "%s.%d.tmp" % (VERDICTS, os.getpid())
    try:  # a record for the textfile: it never fails the verify it records
        with open(tmp, "w") as f:
            f.write(dumps(now))
        os.replace(tmp, VERDICTS)
    except OSError:
        pass
