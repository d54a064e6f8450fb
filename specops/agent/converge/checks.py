"""Checks a batch runs on the host: the installed SGLang's own resolver before anything
changes (preflight), and what an interpreter must report after an install (expect)."""
import os

from specops.agent.host import ActionError, clean, run_owned
from specops.agent.lean import dumps, loads


def named(field, said_as):
    """A field in the inventory's words, SGLang's beside it: "num_draft_tokens (speculative_num_draft_tokens)"."""
    return "%s (%s)" % (said_as[field], field) if field in (said_as or {}) else field


def compare(got, expect, what, said_as=None):
    diffs = ["%s: intended %s, effective %s" % (named(k, said_as), v, got.get(k)) for k, v in sorted(expect.items())
             if got.get(k) != v]
    if diffs:
        raise ActionError("%s: %s" % (what, "; ".join(diffs)))
    return got


def preflight(a):
    """The installed SGLang's own resolver, on these exact arguments, before anything restarts."""
    if not os.path.exists(a.python):
        raise ActionError("host preflight for %s cannot run: %s does not exist" % (a.service, a.python))
    rc, out, err = run_owned([a.python, "-I", "-c", a.script], input=dumps([a.argv]))
    if rc != 0:
        raise ActionError("host preflight could not run SGLang's resolver in %s: %s"
                          % (a.python, clean(err.strip()[-500:])))
    result = loads(out)[0]
    if not result["ok"]:
        raise ActionError("host preflight: the installed SGLang refuses these arguments: %s" % result["error"])
    return compare(result["values"], a.expect, "host preflight (the installed SGLang's own resolver) "
                                                       "refuses %s" % a.service, a.said_as)


def expect(a):
    return expect_in(a.python, a.code, a.expect, a.what)


def expect_in(python, code, expected, what):
    """Run code with an interpreter; its JSON answer must hold the expected values."""
    rc, out, err = run_owned([python, "-I", "-c", code])  # -I: not a module from the working directory
    if rc != 0:
        lines = [l for l in err.strip().splitlines() if l.strip()]
        raise ActionError("%s: %s" % (what, clean(" | ".join(lines[-2:])) or "exit %d" % rc))
    return compare(loads(out), expected, what)
