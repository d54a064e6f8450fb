"""Whether a patched SGLang Python file would fail at run time where its upstream would not.

Owns: the check beyond compiling.  A patch that compiles may still use a name that is not
there (`residual` left over from another release); Python says so only when the line runs, on
the GPU box, mid-request.  So the patched file is read with pyflakes and compared with the
unpatched upstream file of the same version: only problems of the kinds that raise NameError
or UnboundLocalError (undefined name, local used before assignment, undefined name in
`__all__`) and only new ones count; what upstream already has is SGLang's, not the patch's.
Style warnings (unused imports, `import *` usage…) are not looked at.

A diff's patched file is compiled here too (`apply_checked`, `check_edited`): `deploy --check`
compiles nothing on the host, and a stack still to be built has nothing there to compile with,
so a diff that keeps a merge's markers or a line left broken would pass it.  With this Python:
it refuses a file only where the unpatched upstream compiles with it, an upstream in syntax newer
than this Python's being left to the host's compile.  A whole-file patch is compiled by
model_patches (specops/ops/code.py `precompiled`) or the host's validator.

`apply_checked` is patchfile.apply followed by these checks; patchfile itself stays pure diff
logic and does not import this module.  `check_edited`, for a diff `inv patch --edited` is about
to write, also checks that the diff gives the edited file back: that is where a conflict resolved
by hand is checked, long before any host compiles it.
"""
from __future__ import annotations

import ast
import hashlib
import json
import sys
import warnings
from collections import Counter

from .. import memo
from . import patchfile
from .patchfile import PatchError

_SHOWN = 3

# sha256 of an upstream text → its problems' keys (None: it does not parse), since the same
# upstream file is checked again for each host.
_upstream_keys: dict[str, Counter | None] = {}


def _messages(text, filename):
    """pyflakes' run-time-failing messages for the text, or None when it does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings such as "\d" in upstream strings
            tree = ast.parse(text, filename=filename)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte
        return None
    from pyflakes import messages  # only when the memo has no verdict for these texts
    from pyflakes.checker import Checker
    kinds = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
    found = Checker(tree, filename=filename, withDoctest=False).messages
    return sorted((m for m in found if isinstance(m, kinds)), key=lambda m: (m.lineno, m.col))


def _key(m):
    # UndefinedLocal's args carry the line of the outer binding, and pyflakes gives a bare string
    # for a builtin's; the name alone is what moves with the file unchanged.
    args = m.message_args if isinstance(m.message_args, tuple) else (m.message_args,)
    return type(m).__name__, args[:1] if type(m).__name__ == "UndefinedLocal" else args


def _text(m):
    return f"line {m.lineno}: {m.message % m.message_args}"


def problems(upstream: str, patched: str, filename: str) -> list[str]:
    """The patched file's run-time name problems that its upstream file does not have, one line
    each ("line N: undefined name 'residual'", N in the patched file); [] for a file that is not
    Python (by its name) or that does not parse."""
    return _verdict(upstream, patched, filename)["names"]


def _verdict(upstream: str, patched: str, filename: str) -> dict:
    """{"names": problems(), "compile": why the patched file does not compile where its upstream
    does, or None}.  Kept by the memo under both texts and the checker's own code: pyflakes takes
    ~0.2 s on a 180 KB model file, compiling it ~0.05 s, for each host."""
    if not filename.endswith(".py"):
        return {"names": [], "compile": None}
    # this module, pyflakes as installed, and this Python (its parser says what parses)
    name = memo.key(memo.code_id(__file__, "pyflakes", sys.version), filename, upstream, patched)
    return json.loads(memo.cached("patchlint", name, lambda: json.dumps({
        "names": _problems(upstream, patched, filename),
        "compile": _new_compile_error(upstream, patched, filename)}).encode()))


def _new_compile_error(upstream: str, patched: str, filename: str) -> str | None:
    why = _compile_error(patched, filename)
    # An upstream this Python cannot compile either (newer syntax): the host's Python says.
    return why and (None if _compile_error(upstream, filename) else why)


def _problems(upstream: str, patched: str, filename: str) -> list[str]:
    mine = _messages(patched, filename)
    if not mine:
        return []
    digest = hashlib.sha256(upstream.encode("utf-8", "surrogatepass")).hexdigest()
    if digest not in _upstream_keys:
        theirs = _messages(upstream, filename)
        # An upstream this Python cannot parse leaves nothing to compare with: no verdict.
        _upstream_keys[digest] = None if theirs is None else Counter(_key(m) for m in theirs)
    known = _upstream_keys[digest]
    if known is None:
        return []
    known, new = Counter(known), []
    for m in mine:
        if known[_key(m)]:
            known[_key(m)] -= 1
        else:
            new.append(_text(m))
    return new


def check(upstream: str, patched: str, rel: str, version: str) -> None:
    """Refuse a patched sglang/<rel> with a name problem its upstream does not have."""
    _refuse(problems(upstream, patched, f"sglang/{rel}"), rel, version)


def _refuse(new: list[str], rel: str, version: str) -> None:
    if not new:
        return
    shown = "; ".join(new[:_SHOWN]) + ("; …" if len(new) > _SHOWN else "")
    such = "such problem" if len(new) == 1 else "such problems"
    raise PatchError(f"patch sglang/{rel}.patch: the patched file would fail at run time on sglang {version}: "
                     f"{shown} (pyflakes; the unpatched file has no {such})")


def apply_checked(diff_text: str, upstream: str, rel: str, version: str) -> str:
    """patchfile.apply, then the patched file compiled where its upstream compiles, and check():
    the patched text, or a PatchError."""
    patched = patchfile.apply(diff_text, upstream, rel, version)
    _checked(upstream, patched, rel, version)
    return patched


def check_edited(diff_text: str, upstream: str, edited: str, rel: str, version: str) -> None:
    """An edited copy's diff, refused before it is written (`inv patch --edited`): applied as a
    deploy applies it, it must give the edited file back, then pass apply_checked's checks."""
    patched = patchfile.apply(diff_text, upstream, rel, version)
    if patched != edited:
        # The diff keeps sglang's line endings: an edited line saved with CRLF comes back with LF.
        n, ours, theirs = next((n, a, b) for n, (a, b) in enumerate(
            zip(patchfile.lines(patched) + [""], patchfile.lines(edited) + [""]), 1) if a != b)
        raise PatchError(f"patch sglang/{rel}.patch: applied to sglang {version}'s file, the diff does not give "
                         f"back the edited file: its line {n} is {ours!r}, the edited file's {theirs!r}")
    _checked(upstream, patched, rel, version)


def _checked(upstream: str, patched: str, rel: str, version: str) -> None:
    found = _verdict(upstream, patched, f"sglang/{rel}")
    if found["compile"]:
        raise PatchError(f"patch sglang/{rel}.patch: the patched file does not compile: {found['compile']} "
                         f"(sglang {version}'s own does, with Python {sys.version_info[0]}.{sys.version_info[1]})")
    _refuse(found["names"], rel, version)


def _compile_error(text: str, filename: str) -> str | None:
    """'line N: why' when the Python file does not compile; None when it does, or is not Python."""
    if not filename.endswith(".py"):
        return None
    nul = text.find("\0")
    if nul >= 0:  # Python names no line for it (a SyntaxError without one, or a ValueError)
        line = text.count("\n", 0, nul) + 1
        return f"line {line}: a NUL byte, which Python source cannot hold"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, filename, "exec", dont_inherit=True)  # not this module's `from __future__`
    except SyntaxError as e:
        return f"line {e.lineno}: {e.msg}"
    return None
