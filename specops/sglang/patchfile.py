"""Patches to files of the installed sglang package, as text: a unified diff against SGLang's
file (`<rel>.patch`, in the style of npm's patch-package) or a whole replacement file.

Owns: reading a patch's base (`# specops-base: sglang <version> sha256:<hex>`, the upstream file
it was cut from), applying a diff to the installed upstream text, checking a whole-file patch's
base, cutting a diff (`make`) and carrying one onto a new SGLang release (`rebase`, naming each
conflict's hunk and place).  Pure diff logic on text: the caller fetches the upstream file from
the host and writes the result; whether the patched code would run is patchlint's.

Libraries: whatthepatch reads the hunks' lines; merge3 (breezy's three-way merge) does the
rebase; difflib writes diffs.  File headers, hunk headers and "\\ No newline" markers are read
here, around two whatthepatch gaps (see _hunks).  whatthepatch.apply_diff is not used: it
requires every hunk at its stated line numbers (lines added above a hunk, as between SGLang
releases, make it fail), drops "\\ No newline at end of file" and line endings.  So each parsed
hunk is placed here like GNU patch with fuzz 0: its old lines (context + removed) exactly, searched
outward from the stated line, in order, never overlapping the previous hunk; a context found at
several places (none of them the stated line) is refused as ambiguous rather than guessed at.
"""
from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass


from ..errors import UsageError

HEADER = "# specops-base: "
NO_NEWLINE = "\\ No newline at end of file"
BASE_LINES = 30  # a whole-file patch may carry its base line below a licence header
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_BASE_VERSION = re.compile(r"\bsglang\s+(\d\S*)")
_BASE_SHA = re.compile(r"\bsha256:([0-9a-fA-F]{64})\b")


class PatchError(UsageError):
    """A patch that cannot be used with the installed SGLang: one line saying why."""


class HunkError(PatchError):
    """A hunk of a diff that has no one place in the upstream file: `inv patch --rebase` is the way on."""


@dataclass(frozen=True)
class Base:
    """The upstream file a patch was cut from."""
    version: str | None  # sglang version, e.g. "0.5.23"
    sha256: str | None   # hex sha256 of the upstream file's bytes


@dataclass
class _Hunk:
    header: str        # "@@ -40,6 +41,7 @@", for messages
    old_start: int
    ops: list          # (kind, body): kind " " context, "-" removed, "+" added
    eof: bool = False  # a "\ No newline" marker: the hunk ends the file
    new_no_newline: bool = False

    @property
    def old(self):
        return [body for kind, body in self.ops if kind != "+"]


@dataclass(frozen=True)
class Conflict:
    """One patch hunk in one conflict of a rebase, and where that conflict stands in the new file."""
    hunk: int                   # 1-based number of the hunk in the patch
    of: int                     # how many hunks the patch has
    header: str                 # the hunk's "@@ -a,b +c,d @@"
    new_lines: tuple[int, int]  # 1-based, inclusive, in the new upstream; (n, n - 1) when it has none there
    new_version: str = ""       # the new upstream's sglang version, for the message

    def __str__(self):
        start, end = self.new_lines
        whose = f"sglang {self.new_version}'s" if self.new_version else "the new upstream's"
        where = (f"{whose} lines {start}-{end}" if end > start else f"{whose} line {start}" if end == start
                 else f"{whose} removal of its lines, before line {start}")
        return f"hunk {self.hunk} of {self.of} ({self.header}) against {where}"


def upstream_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def base_of(text: str) -> Base | None:
    """The `# specops-base:` line of a patch (diff) or of a whole-file patch, within its first
    lines; "sglang <version>", "sha256:<hex>" or both, in either order.  None when absent."""
    for line in text.split("\n")[:BASE_LINES]:
        if line.startswith(HEADER.rstrip()):
            version, sha = _BASE_VERSION.search(line), _BASE_SHA.search(line)
            if not (version or sha):
                raise PatchError(f"unreadable base line {line.strip()!r}: want "
                                 f"'{HEADER}sglang <version>' and/or 'sha256:<64 hex>'")
            return Base(version and version.group(1), sha and sha.group(1).lower())
    return None


def lines(text: str) -> list[str]:
    """The lines of a text, each with its line ending (the last may have none)."""
    # Split at "\n" only: str.splitlines() also splits at form feeds and U+2028, which a Python
    # line may hold.
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _body(line):
    return line.rstrip("\n").rstrip("\r")


def _describe(version, sha):
    if version and sha:
        return f"sglang {version} (sha256 {sha[:8]}…)"
    return f"sglang {version}" if version else f"the upstream file with sha256 {sha[:8]}…"


def _hunks(diff_text, rel, name):
    """The diff's hunks, checked to change sglang/<rel> and nothing else."""
    raw = [_body(line) for line in diff_text.split("\n")]
    hunks, files, counts, prev = [], [], [0, 0], ""
    for i, line in enumerate(raw):
        m = _HUNK.match(line)
        if m:
            old_start, old_n, new_start, new_n = m.groups()
            # whatthepatch reads an omitted count ("@@ -5 +5,2 @@", as difflib writes) as 0 and
            # then drops context lines; the format means 1.
            counts = [int(old_n or 1), int(new_n or 1)]
            raw[i] = f"@@ -{old_start},{counts[0]} +{new_start},{counts[1]} @@{line[m.end():]}"
            hunks.append(_Hunk(m.group(0), int(old_start), []))
        elif hunks and line.startswith("\\"):
            hunks[-1].eof = True
            hunks[-1].new_no_newline |= prev[:1] in (" ", "+")
        elif counts[0] or counts[1]:
            if line == "" and counts[0] and counts[1]:
                raw[i] = line = " "  # an editor stripped a blank context line's space
            counts[0] -= line[:1] in (" ", "-")
            counts[1] -= line[:1] in (" ", "+")
        elif line.startswith("+++ ") and prev.startswith("--- "):
            # whatthepatch splits files only at headers with timestamps, which difflib leaves out.
            files += [prev[4:].split("\t")[0], line[4:].split("\t")[0]]
        if line and line.splitlines()[0] != line:
            raise PatchError(f"{name}: line {i + 1} holds a line separator other than a newline "
                             f"(form feed, U+2028…), which the diff parser cannot keep")
        prev = line
    import whatthepatch  # only for a diff: a whole file (checked on every deploy) needs no parser
    from whatthepatch.exceptions import WhatThePatchException
    try:
        diffs = [d for d in whatthepatch.parse_patch(raw) if d.changes]
    except WhatThePatchException as e:
        raise PatchError(f"{name}: unreadable diff: {e}") from None
    if not diffs or not hunks:
        raise PatchError(f"{name} has no hunks")
    if len(files) > 2:
        raise PatchError(f"{name} changes {len(files) // 2} files; a patch changes only sglang/{rel}")
    for path in files or ["an unnamed file"]:
        if not ("/" + path).endswith(f"/sglang/{rel}"):
            raise PatchError(f"{name} changes {path}, not sglang/{rel}")
    ids = sorted({c.hunk for c in diffs[0].changes})
    if len(diffs) > 1 or len(ids) != len(hunks):
        raise PatchError(f"{name}: unreadable diff: {len(hunks)} hunk headers but {len(ids)} hunks read")
    for c in diffs[0].changes:
        kind = "+" if c.old is None else "-" if c.new is None else " "
        hunks[ids.index(c.hunk)].ops.append((kind, c.line))
    return hunks


def _find(bodies, old, guess, lo, hi):
    """The places `old` could go in `bodies` within lo..hi: [guess] when it stands there, else
    every place it stands (none, one, or several: ambiguous)."""
    if lo <= guess <= hi and bodies[guess:guess + len(old)] == old:
        return [guess]
    return [pos for pos in range(lo, hi + 1) if bodies[pos:pos + len(old)] == old]


def _at_lines(places):
    lines = [str(pos + 1) for pos in places[:3]]
    if len(places) > 3:
        return ", ".join(lines) + ", …"
    return ", ".join(lines[:-1]) + " and " + lines[-1]


def apply(diff_text: str, upstream: str, rel: str, version: str) -> str:
    """The patched file: the diff applied to the installed upstream text, each hunk exactly
    (fuzz 0) but wherever it now stands."""
    return _apply(diff_text, upstream, rel, version)[0]


def _apply(diff_text, upstream, rel, version):
    """(the patched text, [(hunk, start, end)]: each hunk's old lines at upstream[start:end], 0-based)."""
    name = f"patch sglang/{rel}.patch"
    hunks = _hunks(diff_text, rel, name)
    up = lines(upstream)
    bodies = [_body(line) for line in up]
    newline = "\r\n" if up and up[0].endswith("\r\n") else "\n"
    out, cursor, shift, placed = [], 0, 0, []
    for n, h in enumerate(hunks, 1):
        old = h.old
        if not any(kind == " " for kind, _ in h.ops):
            raise PatchError(f"{name}: hunk {n} ({h.header}) has no context lines, so where it goes in "
                             f"sglang {version}'s {rel} cannot be checked; cut it with context (as --edited does)")
        # A hunk with no old lines (diff -U0) inserts after its stated line.
        guess = h.old_start - (1 if old else 0) + shift
        hi = len(up) - len(old)
        places = _find(bodies, old, guess, max(cursor, hi) if h.eof else cursor, hi)
        if len(places) > 1:
            raise HunkError(f"{name}: hunk {n} of {len(hunks)} ({h.header}) is ambiguous in sglang {version}'s "
                             f"{rel}: its lines stand at lines {_at_lines(places)}")
        if not places:
            base = base_of(diff_text)
            cut = f" (cut from {_describe(base.version, None if base.version else base.sha256)})" if base else ""
            raise HunkError(f"{name}: hunk {n} of {len(hunks)} ({h.header}) does not apply to "
                             f"sglang {version}'s {rel}{cut}")
        pos = places[0]
        out += up[cursor:pos]
        start, at = len(out), pos
        for kind, body in h.ops:
            if kind == "+":
                out.append(body + newline)
            else:
                if kind == " ":  # the installed line, with its own line ending
                    out.append(up[at])
                at += 1
        if h.eof and len(out) > start:
            out[-1] = _body(out[-1]) + ("" if h.new_no_newline else newline)
        cursor, shift = at, pos - guess + shift
        placed.append((h, pos, at))
    return "".join(out + up[cursor:]), placed


def check_whole_file(text: str, rel: str, installed_version: str, installed_sha256: str | None,
                     any_base: bool) -> None:
    """Refuse a whole-file patch that does not say it replaces the installed upstream file."""
    if any_base:
        return
    name = f"patch sglang/{rel}"
    base = base_of(text)
    if base is None:
        raise PatchError(f"{name} says no base: add a line '{HEADER}sglang <version>' naming the "
                         f"sglang version it was cut from, or set patch_any_base")
    # The sha256 says exactly which file; a release that left the file alone still matches it.
    if base.sha256:
        fits = bool(installed_sha256) and base.sha256 == installed_sha256.lower()
    else:
        fits = base.version == installed_version
    if not fits:
        sha = f"sha256 {installed_sha256[:8]}…" if installed_sha256 else "sha256 unknown"
        raise PatchError(f"{name} was cut from {_describe(base.version, base.sha256)}; the installed "
                         f"file is sglang {installed_version}'s ({sha})")


def make(rel: str, upstream: str, edited: str, version: str, sha256: str) -> str:
    """A .patch text: the base line, then a unified diff of upstream → edited."""
    if edited == upstream:
        raise PatchError(f"sglang/{rel}: the edited file is sglang {version}'s unchanged; nothing to patch")
    base = " ".join(part for part in (version and f"sglang {version}", sha256 and f"sha256:{sha256}") if part)
    out = [f"{HEADER}{base}\n"] if base else []
    for line in difflib.unified_diff(lines(upstream), lines(edited), f"a/sglang/{rel}", f"b/sglang/{rel}", n=3):
        # difflib leaves a last line without its newline as it is, gluing the next line on.
        out.append(line if line.endswith("\n") else f"{line}\n{NO_NEWLINE}\n")
    return "".join(out)


def _conflicts(merge, placed, new_version):
    """A Conflict for each hunk whose old lines reach each conflict region of the merge."""
    out = []
    for region in merge.merge_regions():
        if region[0] != "conflict":
            continue
        _, zstart, zend, _, _, bstart, bend = region
        # An empty base range is a place between lines: a hunk touching it is in it.
        mine = [(n, h) for n, (h, start, end) in enumerate(placed, 1)
                if (start < zend and zstart < end if zend > zstart else start <= zstart <= end)]
        if not mine:  # not expected (a's changes are inside its hunks), but a conflict is never dropped
            n = min(range(len(placed)), key=lambda i: abs(placed[i][1] - zstart)) + 1
            mine = [(n, placed[n - 1][0])]
        out += [Conflict(n, len(placed), h.header, (bstart + 1, bend), new_version) for n, h in mine]
    return out


def rebase(diff_text: str, old_upstream: str, new_upstream: str, rel: str, new_version: str,
           new_sha256: str) -> tuple[str, list[Conflict]]:
    """The patch carried onto a new upstream file by a three-way merge: (a new .patch, []), or
    (the merged file with diff3-style conflict markers, the base between ||||||| and =======,
    [Conflict]: one per hunk per conflict region, so a region two hunks reach is listed twice)."""
    base = base_of(diff_text)
    old_version = base.version if base and base.version else "(unknown version)"
    ours, placed = _apply(diff_text, old_upstream, rel, old_version)
    import merge3  # only `inv patch --rebase` merges
    merge = merge3.Merge3(lines(old_upstream), lines(ours), lines(new_upstream))
    conflicts = _conflicts(merge, placed, new_version)
    if conflicts:
        merged = merge.merge_lines(name_a=f"patched (sglang {old_version})", name_b=f"sglang {new_version}",
                                   name_base=f"sglang {old_version} (the patch's base)", base_marker="|||||||")
        # A last line without its newline would be glued to the marker after it.
        return "".join(line if line.endswith("\n") else line + "\n" for line in merged), conflicts
    merged = "".join(merge.merge_lines())
    if merged == new_upstream:
        raise PatchError(f"patch sglang/{rel}.patch: sglang {new_version}'s {rel} already has its changes; "
                         f"the patch can go")
    return make(rel, new_upstream, merged, new_version, new_sha256), []
